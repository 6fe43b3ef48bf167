"""``SaturationMonitor``: the Lightning glue around satmon's counters, verdict and abort policy.

The math lives in :mod:`satmon.functional`, counting in :mod:`satmon.core.saturation_hooks`, the rule in
:mod:`satmon.verdict`, the stop policy in :mod:`satmon.abort`, the writing in
:mod:`satmon.writers.tensorboard`. This file decides *when*.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from satmon.abort import ABORT_MODES, ABORT_ON, AbortMode, AbortOn, SatmonAbort, StopReason, StopRecord, breaches
from satmon.core.gate_hooks import GateCounter, GateHooks, LossHistory
from satmon.discovery import NormLayer, Selector, find_dyt_layers, find_norm_layers
from satmon.functional.loss import robust_z
from satmon.core.gated_mlp import GatingReport, detect_gating
from satmon.live_probe import LiveProbe
from satmon.core.saturation_hooks import SaturationCounter, SaturationHooks
from satmon.verdict import GatingInfo, LayerCounts, Source, Verdict, build_verdict
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
        abort_on: when satmon stops training (every DDP rank takes the same decision):
            ``"never"`` (default); ``"no-go"``: a NO-GO verdict at the end of the window;
            ``"collapse"``: collapse risk at the verdict or during the watch; ``"any"``: all of
            these plus non-finite values and loss spikes during the watch.
        abort_mode: ``"graceful"`` (the Trainer finishes the step, your ``ModelCheckpoint`` saves if
            it is set to, and ``fit`` returns) or ``"raise"`` (:class:`satmon.SatmonAbort`).
        dry_run: log what would have stopped the run (TensorBoard text ``satmon/stop``, console),
            without stopping it.
        collapse_threshold: pooled DyT saturation at or above which a gated model (DyT feeding a
            SwiGLU/GeGLU MLP) is a collapse risk (study: 0.5).
        gating_mapping: ``{dyt_layer_name: gated_mlp_module_name}`` when names do not tell which
            DyT feeds which gated MLP.
        watch_every_n_steps: after the window, measure one optimizer step in every this many
            (saturation of gated blocks, non-finite DyT inputs, the loss); ``0`` turns the watch off.
        patience: consecutive breaching checks before a watch breach stops the run.
        loss_spike_z: a loss spike is a median loss since the last check more than this many
            robust sigmas (1.4826 MAD) above the median of the ``loss_baseline`` steps before it.
        loss_baseline: steps in the loss baseline.
        sample_every: count only every ``k``-th optimizer step of the window (cheaper; the verdict
            then rests on ``window / k`` steps).
        on_missing: ``"raise"`` (default) or ``"warn"`` when the model has no DyT layer.
        verbose: print the verdict card to the console (rank zero).
        probe_every_n_steps: run :func:`satmon.probing.probe` (dead directions, residual-stream
            ``sigma_min``) on a fixed calibration set every this many optimizer steps, from step 0 on,
            also after the window; ``None``: off. See :class:`satmon.live_probe.LiveProbe`.
        probe_on_checkpoint: run the probe at each checkpoint save (once per step at most).
        calibration_batches: batches taken once from the training loader at train start for the probe.
        probe_forward_fn: ``forward_fn(model, batch)`` for the probe; default ``model(batch[0])`` for
            ``(x, y)`` batches (:func:`satmon.probing.feed_first`). With a probe set, a model without
            DyT layers is not an error: the saturation screen is off and the probe runs.

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
        collapse_threshold: float = 0.5,
        gating_mapping: dict[str, str] | None = None,
        watch_every_n_steps: int = 50,
        patience: int = 1,
        loss_spike_z: float = 8.0,
        loss_baseline: int = 200,
        sample_every: int = 1,
        on_missing: str = "raise",
        verbose: bool = True,
        probe_every_n_steps: int | None = None,
        probe_on_checkpoint: bool = False,
        calibration_batches: int = 4,
        probe_forward_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
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
        if not (isinstance(collapse_threshold, (int, float)) and 0.0 < collapse_threshold < 1.0):
            raise ValueError(f"Expected `collapse_threshold` in (0, 1) (the study's is 0.5), got {collapse_threshold!r}.")
        if not isinstance(watch_every_n_steps, int) or watch_every_n_steps < 0:
            raise ValueError(f"Expected `watch_every_n_steps` to be an int >= 0 (0 turns the watch off), got {watch_every_n_steps!r}.")
        if not isinstance(patience, int) or patience < 1:
            raise ValueError(f"Expected `patience` to be an int >= 1 (consecutive breaching checks), got {patience!r}.")
        if not (isinstance(loss_spike_z, (int, float)) and loss_spike_z > 0):
            raise ValueError(f"Expected `loss_spike_z` > 0 (robust sigmas), got {loss_spike_z!r}.")
        if not isinstance(loss_baseline, int) or loss_baseline < 2:
            raise ValueError(f"Expected `loss_baseline` to be an int >= 2 (steps), got {loss_baseline!r}.")
        if gating_mapping is not None and not isinstance(gating_mapping, dict):
            raise ValueError(f"Expected `gating_mapping` to be a dict {{dyt_layer: gated_mlp}}, got {type(gating_mapping).__name__}.")
        if on_missing not in ("raise", "warn"):
            raise ValueError(f"Expected `on_missing` in ('raise', 'warn'), got {on_missing!r}.")
        self.window, self.threshold, self.level = window, float(threshold), float(level)
        self.log_every_n_steps = log_every_n_steps
        self.include, self.exclude = include, exclude
        self.abort_on, self.abort_mode, self.dry_run = abort_on, abort_mode, dry_run
        self.sample_every, self.on_missing, self.verbose = sample_every, on_missing, verbose
        self.collapse_threshold, self.gating_mapping = float(collapse_threshold), gating_mapping
        self.watch_every_n_steps, self.patience = watch_every_n_steps, patience
        self.loss_spike_z, self.loss_baseline = float(loss_spike_z), loss_baseline
        live = LiveProbe(probe_every_n_steps, probe_on_checkpoint, calibration_batches, probe_forward_fn, include=include,
                         exclude=exclude, level=level, threshold=threshold, collapse_threshold=collapse_threshold,
                         gating_mapping=gating_mapping)  # validates the probe arguments
        self.live_probe: LiveProbe | None = live if live.active else None

        self.layer_names: list[str] = []
        self.counter: SaturationCounter | None = None
        self.hooks: SaturationHooks | None = None
        self.gating: GatingReport | None = None
        self.gate_hooks: GateHooks | None = None
        self.watch_hooks: SaturationHooks | None = None
        self.losses: LossHistory | None = None
        self.watch_log: list[dict[str, Any]] = []  # one record per watch check (host values)
        self._streak: dict[StopReason, int] = {}
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
            if self.live_probe is not None:
                rank_zero_info(f"satmon: no DyT layer in {type(pl_module).__name__}: the saturation screen is off, the live probe runs.")
                return
            if self.on_missing == "raise":
                raise ValueError(msg)
            rank_zero_warn(msg + " Monitoring is off for this run (on_missing='warn').")
            return
        self.layer_names = [l.name for l in layers]
        self.gating = detect_gating(pl_module, norm_names=self.layer_names, mapping=self.gating_mapping)
        if self.gating.gated and not self.gating.pairings:
            rank_zero_warn(f"satmon: {self.gating.message}")
        if not trainer.loggers:
            rank_zero_warn("satmon: the Trainer has no logger, so nothing goes to TensorBoard; the verdict is printed and kept in `monitor.verdict`.")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.live_probe is not None:
            self.live_probe.capture(trainer, pl_module)
            self._probe(self.live_probe.maybe_run, trainer, pl_module)
        if not self.layer_names:
            return
        layers = self._discover(pl_module)  # after the strategy wrapped the model (DDP/FSDP/compile)
        names = [l.name for l in layers]
        if names != self.layer_names:
            raise RuntimeError(f"Expected the same DyT layers as at setup ({self.layer_names}), got {names}.")
        keep = pl_module.device.type == "cpu"  # CPU: the hooks keep the inputs, counted around the backward
        self.counter = SaturationCounter(len(layers), level=self.level, keep_inputs=keep).to(pl_module.device)
        if self._loaded is not None:
            self._restore(self._loaded, trainer)
            self._loaded = None
        self.hooks = SaturationHooks(layers, self.counter)
        self._last_step = trainer.global_step
        if self.gating is not None and self.gating.pairings:
            self.gate_hooks = GateHooks(pl_module, self.gating, GateCounter(len(self.gating.pairings)).to(pl_module.device))
        if self.watch_every_n_steps:
            self.watch_hooks = SaturationHooks(layers, SaturationCounter(len(layers), level=self.level, keep_inputs=keep).to(pl_module.device))
            self.losses = LossHistory(self.loss_baseline + self.watch_every_n_steps, device=pl_module.device)
        if self.verdict is None and trainer.global_step < self.window:
            self.hooks.attach()
            self.hooks.enabled = True
            if self.gate_hooks is not None:
                self.gate_hooks.attach()
            add_layout(trainer.loggers, self.layer_names)
        else:
            self._start_watch()

    # ------------------------------------------------------------------ which forwards are counted
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.hooks is not None and self.hooks.attached and self.sample_every > 1:
            self.hooks.enabled = trainer.global_step % self.sample_every == 0
        if self.hooks is not None and self.hooks.attached and self.hooks.enabled:
            self.hooks.refresh_thresholds()  # one batched op per step instead of one per layer
        elif self.watch_hooks is not None and self.watch_hooks.attached:
            on = trainer.global_step % self.watch_every_n_steps == 0  # flips once per check: 2 compiled variants at most
            if self.watch_hooks.enabled != on:
                self.watch_hooks.enabled = on
                if self.gate_hooks is not None:
                    self.gate_hooks.enabled = on

    def _set_counting(self, on: bool) -> None:
        for hooks in (self.hooks, self.gate_hooks):
            if hooks is not None and hooks.attached:
                hooks.enabled = on
        if self.watch_hooks is not None and not on:
            self.watch_hooks.enabled = False

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._set_counting(False)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.hooks is not None and self.hooks.attached:
            self._set_counting(True)

    # ------------------------------------------------------------------------------ per step
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        # the forward is over: count the inputs the hooks kept (CPU), while autograd holds them anyway and
        # before the optimizer step changes alpha
        self._count_kept_inputs()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # activation checkpointing re-runs forwards inside the backward: their inputs too, before the optimizer step
        self._count_kept_inputs()

    def _count_kept_inputs(self) -> None:
        for hooks in (self.hooks, self.watch_hooks):
            if hooks is not None:
                hooks.counter.count_inputs()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.live_probe is not None:  # before the early returns; it probes each step once at most
            self._probe(self.live_probe.maybe_run, trainer, pl_module)
        if self.hooks is None:
            return
        if self.losses is not None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                self.losses.push(loss)  # device copy, no host sync
        if step == self._last_step:  # mid gradient accumulation
            return
        self._last_step = step
        if self.verdict is not None:
            if self.watch_hooks is not None and self.watch_hooks.enabled:
                self._watch_check(trainer, step)
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

    # ---------------------------------------------------------------------------- live probe
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.live_probe is not None:
            self._probe(self.live_probe.on_save_checkpoint, trainer, pl_module)

    def _probe(self, run: Callable[[pl.Trainer, pl.LightningModule], Any], trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Run the live probe with satmon's counting hooks paused: its forwards are not training forwards."""
        paused = [(h, h.enabled) for h in (self.hooks, self.gate_hooks, self.watch_hooks) if h is not None]
        for h, _ in paused:
            h.enabled = False
        try:
            run(trainer, pl_module)
        finally:
            for h, on in paused:
                h.enabled = on

    # ----------------------------------------------------------------------------- readings
    def _readings(self) -> dict[str, Any]:
        """Counts summed over ranks, moved to the host once (the only host transfer)."""
        assert self.hooks is not None
        sat, total, bad, alphas = self.hooks.host_counts(sync=True)
        n = sum(total)
        return {
            "pooled": sum(sat) / n if n else 0.0,
            "per_layer": {name: (s / t if t else 0.0) for name, s, t in zip(self.layer_names, sat, total)},
            "alpha": dict(zip(self.layer_names, alphas)),
            "elements": n,
            "nonfinite": sum(bad),
            "counts": list(zip(sat, total, bad)),
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
        self.hooks.detach()  # the window is over: only the idle collapse-watch hooks (if any) remain
        self.hooks.enabled = False
        gated_layers = list(self.gating.pairings) if self.gating is not None else []
        risk: dict[str, dict[str, float]] = {}
        if self.gate_hooks is not None:
            self.gate_hooks.detach()
            for norm, stats in self.gate_hooks.readings().items():
                risk[self.gating.pairings[norm].mlp] = {"dyt_saturation": r["per_layer"][norm], **stats}
            self.gate_hooks.counter.reset()
        gating = None
        if self.gating is not None:
            gating = GatingInfo(self.gating.gated, tuple(gated_layers), self.gating.message)
        verdict = build_verdict(
            {name: LayerCounts(*c) for name, c in zip(self.layer_names, r["counts"])}, step=step, window=self.steps_seen if partial else self.window,
            source=Source.WINDOW, planned_window=self.window, threshold=self.threshold, level=self.level, gating=gating,
            collapse_threshold=self.collapse_threshold, risk=risk,
        )
        self.verdict = verdict
        log_scalars(trainer.loggers, self._scalars(r), step)
        log_verdict(trainer.loggers, verdict)
        if self.verbose:
            rank_zero_info("\n" + verdict.card() + "\n")
        log.info(verdict.summary())
        if partial:
            return
        if verdict.collapse_risk:
            self._streak[StopReason.COLLAPSE_RISK] = 1
            if self.abort_on == "no-go" or self.patience == 1:
                if self._maybe_stop(trainer, StopReason.COLLAPSE_RISK, verdict.reason, step):
                    return
        elif not verdict.go and self._maybe_stop(trainer, StopReason.NO_GO, verdict.reason, step):
            return
        self._start_watch()

    # ------------------------------------------------------------------------ collapse watch
    def _start_watch(self) -> None:
        """After the window: the watch hooks stay attached but disabled between checks (a flag, so
        ``torch.compile`` keeps two graphs instead of recompiling at every check)."""
        if self.watch_hooks is not None:
            self.watch_hooks.attach()
            self.watch_hooks.enabled = False
        if self.gate_hooks is not None and self.watch_hooks is not None:
            self.gate_hooks.attach()
            self.gate_hooks.enabled = False

    def _watch_check(self, trainer: pl.Trainer, step: int) -> None:
        """One watch check: read the watched step's counts and the loss history, log, apply the policy."""
        assert self.watch_hooks is not None
        self.watch_hooks.enabled = False
        counter = self.watch_hooks.counter
        with counter.sync_context(should_sync=True, should_unsync=True):
            sat, total, bad = torch.stack([counter.saturated, counter.total, counter.nonfinite]).cpu().tolist()
        counter.reset()
        gated = [i for i, n in enumerate(self.layer_names) if self.gating is not None and n in self.gating.pairings]
        g_total = sum(total[i] for i in gated)
        gated_sat = sum(sat[i] for i in gated) / g_total if g_total else None
        scalars: dict[str, float] = {"satmon/collapse/nonfinite": float(sum(bad))}
        if gated_sat is not None:
            scalars["satmon/collapse/saturation"] = gated_sat
        if self.gate_hooks is not None:
            self.gate_hooks.enabled = False
            for norm, stats in self.gate_hooks.readings().items():
                for k, v in stats.items():
                    scalars[f"satmon/collapse/{k}/{self.gating.pairings[norm].mlp}"] = v
            self.gate_hooks.counter.reset()
        baseline, recent = self.losses.read() if self.losses is not None else ([], [])
        loss_nonfinite = any(not math.isfinite(v) for v in recent)
        finite_base = [v for v in baseline if math.isfinite(v)]
        z = robust_z([v for v in recent if math.isfinite(v)], finite_base) if len(finite_base) >= 10 else 0.0
        # Every rank must take the same decision from the same numbers: counts are already summed over
        # ranks; the loss readings are per rank, so take their maximum over ranks (one all-reduce).
        local = torch.tensor([float(loss_nonfinite), z], dtype=torch.float64, device=counter.total.device)
        loss_nonfinite, z = (bool(v) if i == 0 else float(v) for i, v in enumerate(trainer.strategy.reduce(local, reduce_op="max").tolist()))
        if recent:
            scalars["satmon/collapse/loss_z"] = z
        found = {
            StopReason.COLLAPSE_RISK: gated_sat is not None and gated_sat >= self.collapse_threshold,
            StopReason.NONFINITE: sum(bad) > 0 or loss_nonfinite,
            StopReason.LOSS_SPIKE: z > self.loss_spike_z,
        }
        for k, v in found.items():
            self._streak[k] = self._streak.get(k, 0) + 1 if v else 0
            scalars[f"satmon/collapse/breach/{k.value}"] = float(v)
        log_scalars(trainer.loggers, scalars, step)
        self.watch_log.append({"step": step, "gated_saturation": gated_sat, "nonfinite": sum(bad), "loss_z": z, **{k.value: v for k, v in found.items()}})
        messages = {
            StopReason.COLLAPSE_RISK: f"saturation of DyT feeding gated MLPs {gated_sat if gated_sat is not None else 0:.4f} >= {self.collapse_threshold:g}",
            StopReason.NONFINITE: f"{sum(bad)} DyT layer input(s) with non-finite values" + (" and a non-finite training loss" if loss_nonfinite else "") + " in the watched step",
            StopReason.LOSS_SPIKE: f"training loss {z:.1f} robust sigmas above its running baseline (limit {self.loss_spike_z:g})",
        }
        for reason in (StopReason.NONFINITE, StopReason.COLLAPSE_RISK, StopReason.LOSS_SPIKE):
            if self._streak.get(reason, 0) >= self.patience and (self.stop is None or self.stop.dry_run):
                msg = messages[reason] + (f" for {self.patience} consecutive checks" if self.patience > 1 else "")
                if self._maybe_stop(trainer, reason, msg, step):
                    return

    # ---------------------------------------------------------------------------------- stopping
    def _maybe_stop(self, trainer: pl.Trainer, reason: StopReason, message: str, step: int) -> bool:
        """Apply the abort policy; every rank takes the same decision (reduced with OR)."""
        wants = breaches(self.abort_on, reason)
        if not trainer.strategy.reduce_boolean_decision(wants, all=False):
            return False
        if self.stop is not None and self.stop.dry_run and self.stop.reason == reason:
            return False  # a dry run reports each reason once
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
            "layers": list(self.layer_names) or list((self._loaded or {}).get("layers", [])),
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
