"""``SaturationMonitor``: the Lightning glue around satmon's counters, verdict and abort policy.

The math lives in :mod:`satmon.functional`, counting in :mod:`satmon.saturation`, the rule in
:mod:`satmon.verdict`, the stop policy in :mod:`satmon.abort`, the writing in
:mod:`satmon.writers.tensorboard`. This file decides *when*.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from satmon.abort import ABORT_MODES, ABORT_ON, AbortMode, AbortOn, SatmonAbort, StopReason, StopRecord, breaches
from satmon.discovery import NormLayer, Selector, find_dyt_layers, find_norm_layers
from satmon.saturation import SaturationCounter, SaturationHooks
from satmon.verdict import Verdict, decide
from satmon.writers.tensorboard import TAG, add_layout, log_scalars, log_text, log_verdict

__all__ = ["SaturationMonitor"]

log = logging.getLogger("satmon")


class SaturationMonitor(Callback):
    r"""Screen a DyT model during its first ``window`` optimizer steps and give a GO / NO-GO verdict.

    Forward hooks on every DyT layer count, on the activations' device, the elements with
    ``|alpha * x| > level`` during training forward passes (not validation, not the sanity check).
    At the end of the window the pooled fraction is compared with ``threshold``:
    GO (``>=``: DyT acts as a regulariser) or NO-GO (``<``: switch back to LayerNorm). Then the
    hooks are removed and the rest of training pays nothing.

    Args:
        window: screening window in optimizer steps (gradient accumulation does not change it).
        threshold: GO threshold on pooled saturation (study: 0.43; supply your own calibration).
        level: saturation level; an element is saturated when ``|alpha * x| > level`` (strict).
        log_every_n_steps: running saturation is logged (and transferred to the host) every this
            many optimizer steps; ``None`` uses the Trainer's ``log_every_n_steps``.
        include: extra layers to monitor: a regex on module names or a predicate ``(name, module)``.
        exclude: layers to skip, same form.
        abort_on: ``"never"`` (default) or ``"no-go"``: stop training at the end of the window when
            the verdict is NO-GO (every DDP rank agrees).
        abort_mode: ``"graceful"`` (the Trainer finishes the step and exits) or ``"raise"``
            (:class:`satmon.SatmonAbort`).
        dry_run: log what would have stopped the run, without stopping it.
        sample_every: count only every ``k``-th optimizer step of the window (cheaper; the verdict
            then rests on ``window / k`` steps).
        on_missing: ``"raise"`` (default) or ``"warn"`` when the model has no DyT layer.
        verbose: print the verdict card to the console (rank zero).

    Example:
        >>> import lightning.pytorch as pl
        >>> from satmon import SaturationMonitor
        >>> monitor = SaturationMonitor(window=500, threshold=0.43)
        >>> trainer = pl.Trainer(callbacks=[monitor], max_steps=1000, logger=False)  # doctest: +SKIP
        >>> monitor.window, monitor.threshold
        (500, 0.43)
    """

    def __init__(
        self,
        window: int = 500,
        threshold: float = 0.43,
        level: float = 2.0,
        log_every_n_steps: int | None = None,
        include: Selector = None,
        exclude: Selector = None,
        abort_on: AbortOn = "never",
        abort_mode: AbortMode = "graceful",
        dry_run: bool = False,
        sample_every: int = 1,
        on_missing: str = "raise",
        verbose: bool = True,
    ) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
            raise ValueError(f"Expected `window` to be a positive int (optimizer steps), got {window!r}.")
        if not (isinstance(threshold, (int, float)) and 0.0 < threshold < 1.0):
            raise ValueError(f"Expected `threshold` in (0, 1) (a saturation fraction; the study's is 0.43), got {threshold!r}.")
        if not (isinstance(level, (int, float)) and math.isfinite(level) and level > 0):
            raise ValueError(f"Expected `level` > 0 (the |alpha * x| cut-off; the study's is 2.0), got {level!r}.")
        if log_every_n_steps is not None and (not isinstance(log_every_n_steps, int) or log_every_n_steps <= 0):
            raise ValueError(f"Expected `log_every_n_steps` to be a positive int or None, got {log_every_n_steps!r}.")
        if abort_on not in ABORT_ON:
            raise ValueError(f"Expected `abort_on` in {ABORT_ON}, got {abort_on!r}.")
        if abort_mode not in ABORT_MODES:
            raise ValueError(f"Expected `abort_mode` in {ABORT_MODES}, got {abort_mode!r}.")
        if not isinstance(sample_every, int) or sample_every < 1 or sample_every > window:
            raise ValueError(f"Expected `sample_every` to be an int in [1, window={window}], got {sample_every!r}.")
        if on_missing not in ("raise", "warn"):
            raise ValueError(f"Expected `on_missing` in ('raise', 'warn'), got {on_missing!r}.")
        self.window, self.threshold, self.level = window, float(threshold), float(level)
        self.log_every_n_steps = log_every_n_steps
        self.include, self.exclude = include, exclude
        self.abort_on, self.abort_mode, self.dry_run = abort_on, abort_mode, dry_run
        self.sample_every, self.on_missing, self.verbose = sample_every, on_missing, verbose

        self.layer_names: list[str] = []
        self.counter: SaturationCounter | None = None
        self.hooks: SaturationHooks | None = None
        self.verdict: Verdict | None = None
        self.stop: StopRecord | None = None
        self.steps_seen = 0
        self._last_step = -1
        self._loaded: dict[str, Any] | None = None

    # ----------------------------------------------------------------------------------------- setup
    @property
    def state_key(self) -> str:
        return self._generate_state_key(window=self.window, threshold=self.threshold, level=self.level)

    def _discover(self, pl_module: pl.LightningModule) -> list[NormLayer]:
        return find_dyt_layers(pl_module, include=self.include, exclude=self.exclude)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        layers = self._discover(pl_module)
        if not layers:
            others = find_norm_layers(pl_module, kinds=("layernorm", "rmsnorm"))
            msg = (
                f"satmon found no DyT layer in {type(pl_module).__name__}: it looks for modules that own a parameter "
                f"named `alpha` and whose forward uses tanh (satmon.DyT, or classes named *DyT*/*DynamicTanh*). "
                f"It found {len(others)} LayerNorm/RMSNorm layer(s) instead. Convert them with "
                "`satmon.convert_to_dyt(model)`, or point satmon at your layers with "
                "`SaturationMonitor(include='regex on module names')` or a predicate `include=lambda name, m: ...`."
            )
            if self.on_missing == "raise":
                raise ValueError(msg)
            rank_zero_warn(msg + " Monitoring is off for this run (on_missing='warn').")
            return
        self.layer_names = [l.name for l in layers]
        if not trainer.loggers:
            rank_zero_warn("satmon: the Trainer has no logger, so nothing goes to TensorBoard; the verdict is printed and kept in `monitor.verdict`.")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.layer_names:
            return
        layers = self._discover(pl_module)  # after the strategy wrapped the model (DDP/FSDP/compile)
        names = [l.name for l in layers]
        if names != self.layer_names:
            raise RuntimeError(f"Expected the same DyT layers as at setup ({self.layer_names}), got {names}.")
        self.counter = SaturationCounter(len(layers), level=self.level).to(pl_module.device)
        if self._loaded is not None:
            self._restore(self._loaded, trainer)
            self._loaded = None
        self.hooks = SaturationHooks(layers, self.counter)
        self._last_step = trainer.global_step
        if self.verdict is None and trainer.global_step < self.window:
            self.hooks.attach()
            self.hooks.enabled = True
            add_layout(trainer.loggers, self.layer_names)

    # ------------------------------------------------------------------ which forwards are counted
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.hooks is not None and self.hooks.attached and self.sample_every > 1:
            self.hooks.enabled = trainer.global_step % self.sample_every == 0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.hooks is not None:
            self.hooks.enabled = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.hooks is not None and self.hooks.attached:
            self.hooks.enabled = True

    # ------------------------------------------------------------------------------ per step
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.hooks is None or step == self._last_step:  # not monitoring, or mid gradient accumulation
            return
        self._last_step = step
        if self.verdict is not None:
            return
        self.steps_seen = min(step, self.window)
        every = self.log_every_n_steps or trainer.log_every_n_steps
        if step >= self.window:
            self._conclude(trainer, step)
        elif step % every == 0:
            readings = self._readings()
            log_scalars(trainer.loggers, self._scalars(readings), step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.hooks is not None and self.verdict is None and self.steps_seen > 0:
            rank_zero_warn(
                f"satmon: training ended after {self.steps_seen} of the {self.window} window steps; the verdict rests on "
                "the shorter window. Lower `window` or train longer."
            )
            self._conclude(trainer, trainer.global_step, partial=True)

    # ----------------------------------------------------------------------------- readings
    def _readings(self) -> dict[str, Any]:
        """Counts summed over ranks, moved to the host once (the only host transfer)."""
        assert self.counter is not None and self.hooks is not None
        with self.counter.sync_context(should_sync=True, should_unsync=True):
            packed = torch.stack([self.counter.saturated, self.counter.total, self.counter.nonfinite]).cpu()
        sat, total, bad = packed.tolist()
        alphas = self.hooks.alphas().cpu().tolist()
        n = sum(total)
        return {
            "pooled": sum(sat) / n if n else 0.0,
            "per_layer": {name: (s / t if t else 0.0) for name, s, t in zip(self.layer_names, sat, total)},
            "alpha": dict(zip(self.layer_names, alphas)),
            "elements": n,
            "nonfinite": sum(bad),
        }

    @staticmethod
    def _scalars(r: dict[str, Any]) -> dict[str, float]:
        out = {TAG.saturation: r["pooled"], TAG.nonfinite: float(r["nonfinite"])}
        out.update({TAG.layer_saturation(k): v for k, v in r["per_layer"].items()})
        out.update({TAG.alpha(k): v for k, v in r["alpha"].items()})
        return out

    def _conclude(self, trainer: pl.Trainer, step: int, partial: bool = False) -> None:
        r = self._readings()
        assert self.hooks is not None
        self.hooks.detach()  # the rest of training runs no satmon code in forward passes
        self.hooks.enabled = False
        verdict = decide(
            r["pooled"], r["per_layer"], threshold=self.threshold, step=step, window=self.steps_seen if partial else self.window,
            level=self.level, elements=r["elements"], nonfinite=r["nonfinite"],
        )
        if partial:
            verdict.reason = f"window cut short at {self.steps_seen} of {self.window} steps; " + verdict.reason
        self.verdict = verdict
        log_scalars(trainer.loggers, self._scalars(r), step)
        log_verdict(trainer.loggers, verdict)
        if self.verbose:
            rank_zero_info("\n" + verdict.card() + "\n")
        log.info(verdict.summary())
        if not verdict.go and not partial:
            reason = StopReason.COLLAPSE_RISK if verdict.collapse_risk else StopReason.NO_GO
            self._maybe_stop(trainer, reason, verdict.reason, step)

    # ---------------------------------------------------------------------------------- stopping
    def _maybe_stop(self, trainer: pl.Trainer, reason: StopReason, message: str, step: int) -> bool:
        """Apply the abort policy; every rank takes the same decision (reduced with OR)."""
        wants = breaches(self.abort_on, reason)
        if not trainer.strategy.reduce_boolean_decision(wants, all=False):
            return False
        self.stop = StopRecord(reason=reason, message=message, step=step, dry_run=self.dry_run)
        text = (f"**satmon {'would stop' if self.dry_run else 'stopped'} training at step {step}** "
                f"({reason.value}{', dry run' if self.dry_run else ''}): {message}")
        log_text(trainer.loggers, TAG.stop, text, step)
        log_scalars(trainer.loggers, {TAG.stop: 1.0}, step)
        rank_zero_warn(text.replace("**", ""))
        if self.dry_run:
            return False
        if self.abort_mode == "raise":
            raise SatmonAbort(reason, message, step)
        trainer.should_stop = True
        return True

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        counts: dict[str, list[int]] = {}
        if self.counter is not None:
            # Saved counts are the sum over ranks (Lightning calls state_dict on every rank); on load only
            # rank zero takes them back, so the sum stays right whatever the world size.
            with self.counter.sync_context(should_sync=True, should_unsync=True):
                counts = {k: getattr(self.counter, k).cpu().tolist() for k in ("saturated", "total", "nonfinite")}
        elif self._loaded is not None:
            counts = {k: self._loaded[k] for k in ("saturated", "total", "nonfinite") if k in self._loaded}
        return {
            "version": 1,
            "layers": list(self.layer_names),
            **counts,
            "steps_seen": self.steps_seen,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "stop": self.stop.to_dict() if self.stop else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = dict(state_dict)
        self.steps_seen = int(state_dict.get("steps_seen", 0))
        self.verdict = Verdict.from_dict(state_dict["verdict"]) if state_dict.get("verdict") else None
        self.stop = StopRecord.from_dict(state_dict["stop"]) if state_dict.get("stop") else None
        if self.stop is not None:
            rank_zero_info(f"satmon: the run this checkpoint came from was stopped by satmon at step {self.stop.step} "
                           f"({self.stop.reason.value}): {self.stop.message}")

    def _restore(self, state: dict[str, Any], trainer: pl.Trainer) -> None:
        assert self.counter is not None
        if state.get("layers") and state["layers"] != self.layer_names:
            raise RuntimeError(f"Expected the checkpoint's satmon layers {state['layers']} to match the model's {self.layer_names}.")
        if trainer.global_rank == 0 and "saturated" in state:
            for k in ("saturated", "total", "nonfinite"):
                getattr(self.counter, k).copy_(torch.tensor(state[k], dtype=torch.int64))
