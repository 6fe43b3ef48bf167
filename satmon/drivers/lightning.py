"""``SaturationMonitor``: the Lightning glue that drives satmon's framework-free :class:`~satmon.screen.screen.Screen`.

This file maps Lightning's hook points to ``Screen`` calls, Lightning's strategy to the ranks'
agreement, and Lightning's loggers to the writers. Counting, the verdict, the collapse watch and
the abort policy live in :mod:`satmon.screen`; every option is one :class:`satmon.Settings`.
"""

from __future__ import annotations

import ast
import itertools
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from satmon.batches import feed_first
from satmon.drivers.counting import optimizer_name, planned_tokens, put_scale_note, run_scale, scale_note
from satmon.drivers.live_probe import LiveProbe
from satmon.io.lightning import LightningSink
from satmon.io.sink import MultiSink, Sink, check_sink
from satmon.io.tags import TAG
from satmon.io.tensorboard import log_text
from satmon.model.map import model_map
from satmon.results.forecast import Forecast, run_forecast
from satmon.results.stop import StopRecord
from satmon.results.verdict import Verdict
from satmon.screen.screen import Screen
from satmon.screen.state import STATE_KEY
from satmon.settings import ReadsSettings, Settings, settings_from, short_repr

__all__ = ["STATE_KEY", "SaturationMonitor"]

_SERIAL = itertools.count()  # each monitor's own key until a Trainer's setup binds it (see SaturationMonitor.state_key)

_ON_MISSING = ("warn", "raise")
#: the monitor's own keyword arguments (every other option is a satmon.Settings field)
_OWN = (
    "sink",
    "log_every_n_steps",
    "on_missing",
    "verbose",
    "probe_every_n_steps",
    "probe_on_checkpoint",
    "calibration_batches",
    "probe_forward_fn",
    "gating_forward_fn",
)


def _weak(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj`` (a Trainer, a LightningModule), or one that holds what
    cannot be weakly referenced."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class _StrategyAgreement:
    """Ranks agree through the Lightning strategy (``reduce_boolean_decision`` / ``reduce``)."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self.strategy, self.rank, self.world_size = trainer.strategy, trainer.global_rank, trainer.world_size

    def any(self, flag: bool) -> bool:
        return bool(self.strategy.reduce_boolean_decision(bool(flag), all=False))

    def max(self, values: Tensor) -> Tensor:
        return self.strategy.reduce(values, reduce_op="max")


class SaturationMonitor(ReadsSettings, Callback):
    r"""Screen a DyT model during its first ``window`` optimizer steps and give a GO / NO-GO verdict.

    Forward hooks on every DyT layer count, on the activations' device, the elements with
    ``|alpha * x| > level`` during training forward passes (not validation, not the sanity check).
    At the end of the window the pooled fraction is compared with ``threshold``: GO (``>=``) or NO-GO
    (``<``); any non-finite DyT input makes it ``"non-finite"`` (a diverged run). Then the window's hooks
    are removed. What GO and NO-GO say and what they are worth: :data:`satmon.study.MEANING` and
    :data:`satmon.study.WORTH` (a measurement of saturation, not a forecast of DyT's effect); the card also
    carries the forecast from the run's planned passes over its data (:func:`satmon.forecast`).

    Settings. The rule, the window, the watch and the abort policy are one :class:`satmon.Settings`:
    pass ``settings=`` (built once, shared with a ``Screen``, :func:`satmon.probe` or a replay), or
    its fields as keyword options, which build it (not both). The monitor's own options (how it logs,
    what a model without DyT gets, the live probe, the gating trace's forward) are its keyword
    arguments. ``monitor.settings.window``, ``monitor.settings.rule.threshold``... read the settings.

    Args:
        settings: every setting below at once (a :class:`satmon.Settings`); ``None``: built from ``**options``.
        log_every_n_steps: running saturation is logged (and read from the device) every this many
            optimizer steps; ``None`` uses the Trainer's ``log_every_n_steps``.
        on_missing: what a model without DyT layers gets: ``"warn"`` (default: no screen, a console
            line and a TensorBoard card say why; probes still run) or ``"raise"``.
        sink: a :class:`satmon.io.sink.Sink` of your own that gets everything the loggers get (your tracker, a
            file); it is written beside ``trainer.loggers``, never instead, and it is yours to close.
        verbose: when the verdict is made, print its plain-text card (rank zero, once); by default one line
            (decision, trust, saturation vs threshold, where the card went). :meth:`card` gives the card later,
            or why there is no verdict.
        probe_every_n_steps, probe_on_checkpoint, calibration_batches, probe_forward_fn: the live
            dead-direction probe (:class:`satmon.drivers.live_probe.LiveProbe`); it reads with these settings
            (the same ``level``, ``product``, layers, threshold and caveat).
        gating_forward_fn: how the first training batch reaches the LightningModule for the one traced
            forward that finds gated MLPs (default :func:`satmon.batches.feed_first`: ``model(batch[0])``
            for ``(inputs, targets)`` batches).
        **options: the :class:`satmon.Settings` fields:

            - ``threshold``: GO threshold on pooled saturation; ``None`` (default): the study's
              (:data:`satmon.study.THRESHOLD`), or the calibration's. Supply your own calibration.
            - ``level``: per-element cut-off; an element is saturated when ``|alpha * x| > level`` (strict;
              the study's :data:`satmon.study.LEVEL`).
            - ``collapse_threshold``: pooled DyT saturation at or above which a gated model is a collapse
              risk (the study's :data:`satmon.study.COLLAPSE_THRESHOLD`).
            - ``product``: ``"module"`` (default): count ``alpha * x`` as the layer's forward computes it, rounded
              to ``torch.result_type(alpha, x)`` (bf16 in a bf16 model), as the study measured and as tanh sees
              it; ``"exact"``: the real product (satmon 0.1's rule).
            - ``calibration``: a ``calibration.json`` written by ``satmon calibrate`` on your own runs (or its
              :class:`~satmon.results.calibration.Calibration`): its threshold replaces the study's and its
              provenance replaces the study's caveat on the card. Give ``threshold`` or ``calibration``, not both.
            - ``caveat``: the card's provenance line for your own ``threshold`` (default: the study's, or the
              calibration's).
            - ``window``: screening window in optimizer steps (gradient accumulation does not change it).
            - ``sample_every``: count only every ``k``-th optimizer step of the window.
            - ``offset_every``: on every this many counted window steps, also measure how much of each layer's
              saturation a per-channel constant explains (card flag "offset-driven"); ``0``: off.
            - ``include``: extra layers to monitor: a regex on module names or a predicate ``(name, module)``.
            - ``exclude``: layers to skip, same form.
            - ``gating_mapping``: ``{dyt_layer_name: gated_mlp_module_name}`` (``None`` as a value: the layer
              feeds no gated MLP) when detection cannot tell.
            - ``watch_every_n_steps``: the collapse watch measures one optimizer step in every this many (from
              ``watch_from``); ``0``: off.
            - ``watch_from``: the optimizer step the collapse watch starts at, during the window too (beside its
              counting, which it leaves as is); ``None`` (default): ``warmup_steps`` when given and not 0, else the
              window's end (:attr:`satmon.Settings.watch_start`: started at the warm-up's end, the watch led the loss
              rule in satmon's collapse grid).
            - ``patience``: consecutive breaching checks before a watch breach stops the run.
            - ``loss_spike_z``: robust sigmas (1.4826 MAD) above the loss baseline that make a spike.
            - ``loss_baseline``: steps in the loss baseline.
            - ``trap_every_n_steps``, ``trap_patience``, ``trap_floor``: the trap watch, from step 1: one step in every
              ``trap_every_n_steps`` (``0``: off) reads whether gradient still passes a DyT final norm; ``trapped``
              after ``trap_patience`` checks with none below it (at most ``trap_floor`` x the head's; 0: exactly
              zero) and the final norm saturated by an offset (docs/guides/callback.md). A reading: it never stops.
            - ``abort_on``: ``"never"`` (default), ``"no-go"`` (a NO-GO verdict), ``"collapse"`` (collapse risk
              at the verdict or during the watch), ``"any"`` (all of these, plus non-finite values: checked
              every step, the run stops within one step on every rank, and loss spikes).
            - ``abort_mode``: ``"graceful"`` (``fit`` returns after the step) or ``"raise"``
              (:class:`satmon.SatmonAbort`).
            - ``dry_run``: log what would have stopped the run, without stopping it.
            - ``unique_tokens`` (``train_tokens``, its old name, is deprecated): the unique tokens the run trains on,
              for the card's place of the run on the study's
              phase diagram (parameters x tokens); ``None`` (default): counted from the training dataset when it
              can say them (a map-style dataset's length x tokens per sample), else the card says how to give them.
            - ``planned_tokens``: the tokens training will process, for the card's forecast from the planned passes
              over the data (:func:`satmon.forecast`); ``None`` (default): counted from the trainer (its estimated
              optimizer steps x the dataloader's batch size x ``accumulate_grad_batches`` x world size x the tokens
              of a sample), else the card says how to give them.
            - ``planned_steps``, ``warmup_steps``, ``lr_schedule``: the run's optimizer steps (default: the trainer's
              estimate), its linear warm-up steps and its learning rate's shape (``"linear-warmup-constant"``, the
              study's; ``"linear-warmup-cosine"``...): the forecast is confident only for a run whose steps, warm-up
              share and shape lie within what its cells trained; without warm-up and shape it says "uncertain". The
              warm-up's end is also where the collapse watch starts when ``watch_from`` is not given.

    Raises:
        TypeError: an unknown option (the message lists the valid ones), or ``settings`` that is not a Settings.
        ValueError: a wrong value, or ``settings`` and options together.

    Example:
        >>> from satmon import SaturationMonitor, Settings, study
        >>> monitor = SaturationMonitor(window=500, abort_on="no-go")
        >>> monitor.settings.window, monitor.settings.abort_on, monitor.settings.rule.threshold == study.THRESHOLD
        (500, 'no-go', True)
        >>> shared = Settings(window=200, product="exact")
        >>> SaturationMonitor(settings=shared).settings is shared
        True
        >>> print(monitor.card())  # before training: no verdict yet, and why
        satmon: no verdict
        <BLANKLINE>
        the screen is not attached to a model yet (Screen.attach(model), or the callback at the first batch).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        sink: Sink | None = None,
        log_every_n_steps: int | None = None,
        on_missing: str = "warn",
        verbose: bool = False,
        probe_every_n_steps: int | None = None,
        probe_on_checkpoint: bool = False,
        calibration_batches: int = 4,
        probe_forward_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
        gating_forward_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
        **options: Any,
    ) -> None:
        self.settings = settings_from(settings, options, owner="SaturationMonitor", own=_OWN)
        if log_every_n_steps is not None and (
            isinstance(log_every_n_steps, bool) or not isinstance(log_every_n_steps, int) or log_every_n_steps <= 0
        ):
            raise ValueError(
                f"Expected `log_every_n_steps` to be a positive int or None, got {short_repr(log_every_n_steps)}."
            )
        if on_missing not in _ON_MISSING:
            raise ValueError(f"Expected `on_missing` in {_ON_MISSING}, got {short_repr(on_missing)}.")
        if gating_forward_fn is not None and not callable(gating_forward_fn):
            raise ValueError(
                f"Expected `gating_forward_fn` to be a callable (model, batch) -> Any or None, got "
                f"{short_repr(gating_forward_fn)} ({type(gating_forward_fn).__name__}): pass a function, e.g. "
                "gating_forward_fn=lambda model, batch: model(batch['input_ids']), or None for model(batch[0])."
            )
        self.log_every_n_steps, self.on_missing = log_every_n_steps, on_missing
        self.user_sink = check_sink(sink) if sink is not None else None
        self._loggers: LightningSink | None = None  # the Trainer's loggers, from on_train_start to the end of fit
        self.verbose = Settings.check_flag("verbose", verbose)
        self.gating_forward_fn = gating_forward_fn or feed_first
        self._probe_args = (probe_every_n_steps, probe_on_checkpoint, calibration_batches, probe_forward_fn)
        # the run this monitor screens: weak references to its Trainer and LightningModule (set by setup), whether it
        # screened one before, and what a new run replaced (warned at train start unless a checkpoint was loaded)
        self._bound: tuple[Callable[[], Any], Callable[[], Any]] | None = None
        self._used = False
        self._replaced: str | None = None
        self._serial = next(_SERIAL)
        self._new_run()  # validates the probe arguments

    def _new_run(self) -> None:
        """A screen and live probe with nothing of an earlier run in them."""
        live = LiveProbe(*self._probe_args, settings=self.settings)
        self.live_probe: LiveProbe | None = live if live.active else None
        # the verdict's line (or card, verbose) goes to stdout on rank zero (the Screen's
        # default), as in every satmon driver
        self.screen = Screen(self.settings, warn=rank_zero_warn, verbose=self.verbose)
        self._paused = ExitStack()  # validation: no counting between on_validation_start and _end
        self._attached = False
        self._scale_note = ""  # the card's phase-diagram line, made at train start
        self._forecast: Forecast | None = None  # the card's forecast from the planned passes, made at train start

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_bound"] = None  # weak references do not pickle: a copy is bound again by the setup of its next fit
        return state

    @property
    def verdict(self) -> Verdict | None:
        """The verdict (``None`` before the window closes, or for a model without DyT: :meth:`card` says why)."""
        return self.screen.verdict

    def card(self, markdown: bool = False) -> str:
        """The verdict's card in plain text (``markdown``: as TensorBoard shows it), or why there is none.

        ``print(monitor.card())`` works for every model: for one without DyT it says there is no screen and why.
        """
        return self.screen.card(markdown)

    @property
    def stop(self) -> StopRecord | None:
        return self.screen.stop

    @property
    def steps_seen(self) -> int:
        return self.screen.steps_seen

    @property
    def layer_names(self) -> list[str]:
        return self.screen.layer_names

    @property
    def watch_log(self) -> list[dict[str, Any]]:
        return self.screen.watch.log if self.screen.watch is not None else []

    @property
    def state_key(self) -> str:
        """:data:`STATE_KEY` once ``fit`` set the monitor up in a Trainer (checkpoints are saved and loaded after that).

        The counts belong to the window, not to the settings: one key, so a resume with other settings finds its
        state (and says what changed) instead of silently starting over. Before its first setup each monitor has a
        key of its own, so that Lightning's check of duplicate keys (at ``Trainer(...)``) lets two monitors reach
        setup, which refuses them with satmon's message.
        """
        return STATE_KEY if self._bound is not None else f"{STATE_KEY}#{self._serial}"

    # ----------------------------------------------------------------------------------- setup
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._bind(trainer, pl_module)
        if not self.screen.discover(pl_module, gating=False):  # gating is traced on the first training batch
            self._no_dyt(pl_module)
        elif not trainer.loggers:
            rank_zero_warn(
                "satmon: the Trainer has no logger, so the verdict's card is written nowhere; one line is printed "
                "at the verdict, `print(monitor.card())` prints the card (or SaturationMonitor(verbose=True))."
            )

    def _bind(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Tie the monitor to this fit's run. The same Trainer and model again (a second ``fit``): the run goes on
        (the screen continues its window or watch, :meth:`Screen.attach`). Another Trainer or model: a new screen,
        so that no verdict, count or stop of the other run carries over. Every rank runs the same fits, so every
        rank decides the same (no collective here)."""
        others = [c for c in getattr(trainer, "callbacks", ()) if isinstance(c, SaturationMonitor) and c is not self]
        if others:
            raise ValueError(
                f"Expected one SaturationMonitor per Trainer, got {len(others) + 1}: each would hook the same "
                "DyT layers and write the same TensorBoard tags, and a checkpoint keeps one monitor's state. "
                "Put every setting in one SaturationMonitor(...) (or pass one satmon.Settings as settings=)."
            )
        bound = self._bound
        same = (bound[0]() is trainer, bound[1]() is pl_module) if bound is not None else (False, False)
        if all(same):
            return
        if self._used:
            old = self.screen.verdict
            what = "another Trainer and model" if not any(same) else "another Trainer" if same[1] else "another model"
            was = f"verdict {old.decision.upper()} at step {old.step}" if old is not None else "no verdict yet"
            self._replaced = (
                f"satmon: this SaturationMonitor screened {what} before ({was}); this fit is a new run, so it "
                "starts a new screen: nothing of the other run (counts, verdict, stop) carries over. Use one "
                "SaturationMonitor per run to keep each run's verdict in its own monitor."
            )
            self._new_run()
        self._bound = (_weak(trainer), _weak(pl_module))
        self._used = True

    def _no_dyt(self, pl_module: pl.LightningModule) -> None:
        others = model_map(pl_module).layers(("layernorm", "rmsnorm"))
        msg = (
            f"satmon found no DyT layer in {type(pl_module).__name__}, so the saturation screen is off (no verdict). "
            f"It found {len(others)} LayerNorm/RMSNorm layer(s): the dead-direction probe reads those "
            "(`probe_every_n_steps=` or `satmon.probe`). To screen DyT, convert the norms with "
            "`satmon.convert_to_dyt(model)`,"
            " or point satmon at your DyT layers with `include='regex on module names'` or "
            "`include=lambda name, m: ...`."
        )
        self.screen.status = msg
        if self.on_missing == "raise" and self.live_probe is None:
            raise ValueError(msg + " (on_missing='raise')")
        rank_zero_warn(msg)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._replaced is not None:  # a new run without a checkpoint: say what was left behind
            rank_zero_warn(self._replaced)
            self._replaced = None
        if self.live_probe is not None:
            self.live_probe.capture(trainer, pl_module)
            self._probe(self.live_probe.maybe_run, trainer, pl_module)
        self._loggers = LightningSink(trainer.loggers, root=trainer.default_root_dir)  # closed at the end of fit
        self.screen.sink = MultiSink(self._loggers, self.user_sink) if self.user_sink is not None else self._loggers
        self.screen.log_every_n_steps = self.log_every_n_steps or trainer.log_every_n_steps
        self.screen.agreement = _StrategyAgreement(trainer)
        if not self.screen.active:
            log_text(self.screen.sink, TAG.verdict_text, self.screen.card(markdown=True), trainer.global_step)
        else:
            self._scale_note = scale_note(pl_module, trainer.train_dataloader, self.settings.unique_tokens)
            s = self.settings
            scale = run_scale(pl_module, trainer.train_dataloader, s.unique_tokens)
            planned, how = (
                (s.planned_tokens, "given: planned_tokens=") if s.planned_tokens is not None else _planned(trainer)
            )
            self._forecast = run_forecast(
                scale.params,
                scale.unique_tokens,
                planned,
                scale.missing,
                how,
                s.planned_steps or _stepping(trainer),
                s.warmup_steps,
                s.lr_schedule,
                optimizer=optimizer_name(trainer.optimizers[0] if trainer.optimizers else None),
            )
        self._attached = False  # the hooks go on at the first training batch, which the gating trace reads

    def _note_scale(self) -> None:
        """Put the phase-diagram line among the card's notes, in place of one a resumed state brought back."""
        put_scale_note(self.screen.notes, self._scale_note)
        self.screen.forecast = self._forecast

    def _attach(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        """At the first training batch, on every rank, before any counting hook: trace gating on this batch
        (one eval, no-grad forward of the LightningModule), then attach to the wrapped model."""
        self._attached = True
        # CPU: inputs kept and counted around the backward
        self.screen.attach(
            pl_module,
            step=trainer.global_step,
            keep_inputs=pl_module.device.type == "cpu",
            example_input=batch,
            forward_fn=self.gating_forward_fn,
        )
        self._note_scale()  # after attach: a resume restores the saved notes there
        resumed_mid_window = self.screen.steps_seen > self.screen.first_step and self.screen.verdict is None
        if resumed_mid_window:
            self._warn_data_order(trainer, batch_idx)

    def _warn_data_order(self, trainer: pl.Trainer, batch_idx: int) -> None:
        """A mid-window resume reaches the same verdict only if the data order resumes too."""
        if batch_idx == 0:
            # the first batch of the resumed run opens an epoch (a checkpoint saved at an epoch's last batch or at its
            # end): a new epoch starts where the uninterrupted run's would have, whatever the loader
            return
        loader = trainer.train_dataloader
        loaders = loader if isinstance(loader, (list, tuple)) else [loader]
        if all(hasattr(dl, "state_dict") for dl in loaders if dl is not None):
            return
        message = (
            f"satmon: resumed mid-window at step {trainer.global_step} of {self.settings.window} with a train "
            "dataloader that cannot resume its position (no state_dict): Lightning restarts its epoch, so the rest "
            "of the window sees other batches than an uninterrupted run would. The verdict covers the same number "
            "of steps, not the same data; use a stateful loader (torchdata's StatefulDataLoader) for that."
        )
        rank_zero_warn(message)
        self.screen.notes.append(f"resumed mid-window at step {trainer.global_step}; the data order did not resume")

    # ------------------------------------------------------------------------------------ per step
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._attached and self.screen.active:
            self._attach(trainer, pl_module, batch, batch_idx)
        self.screen.begin_step(trainer.global_step)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        # the forward is over: count the kept inputs (CPU) before the optimizer step changes alpha
        self.screen.count_kept()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.live_probe is not None:  # first: it probes each step once at most
            self._probe(self.live_probe.maybe_run, trainer, pl_module)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.screen.end_step(trainer.global_step, loss)
        if self.screen.should_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.screen.finish(trainer.global_step)
        self.screen.detach()  # no satmon hook stays on the model between fits (the counts stay)
        self._close_loggers()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.screen.detach()
        self._close_loggers()  # e.g. SatmonAbort (abort_mode="raise"): what was written is closed too

    def _close_loggers(self) -> None:
        """Close what the monitor opened over the loggers (a sink of the user's is theirs to close)."""
        if self._loggers is not None:
            self._loggers.close()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._paused.enter_context(self.screen.paused())

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._paused.close()

    # ----------------------------------------------------------------------------------- live probe
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.live_probe is not None:
            self._probe(self.live_probe.on_save_checkpoint, trainer, pl_module)

    def _probe(
        self, run: Callable[[pl.Trainer, pl.LightningModule], Any], trainer: pl.Trainer, pl_module: pl.LightningModule
    ) -> None:
        """Run the live probe with the counting hooks paused: its forwards are not training forwards."""
        with self.screen.paused():
            run(trainer, pl_module)

    # ---------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        # Lightning calls this on every rank inside trainer.save_checkpoint, which every rank must call:
        # the counts are summed over ranks there (rank zero's file keeps the sum)
        return self.screen.state_dict(sync=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._replaced = None  # the checkpoint's state is the run's
        self.screen.load_state_dict(state_dict)
        stop = self.screen.stop
        if stop is not None:
            rank_zero_info(
                f"satmon: the run this checkpoint came from was stopped by satmon at step {stop.step} "
                f"({stop.reason.value}): {stop.message}"
            )

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A satmon 0.1 checkpoint keyed its state by its settings: find it and read the settings from the key."""
        states = checkpoint.get("callbacks", {})
        if self.state_key in states:
            return
        for key, state in states.items():
            if isinstance(key, str) and key.startswith("SaturationMonitor{"):
                try:
                    saved = ast.literal_eval(key[len("SaturationMonitor") :])
                except (ValueError, SyntaxError):
                    saved = {}
                settings = {k: v for k, v in saved.items() if isinstance(v, (int, float))}
                # 0.1 counted the exact product
                self.load_state_dict({**state, "settings": {**settings, "product": "exact"}})
                return


def _stepping(trainer: pl.Trainer) -> float | None:
    """The trainer's estimated optimizer steps, finite, or ``None`` (the forecast's domain
    then says they are unknown)."""
    try:
        steps = float(trainer.estimated_stepping_batches)
    except Exception:  # as _planned: unknown, never a failed run
        return None
    return steps if 0 < steps < float("inf") else None


def _planned(trainer: pl.Trainer) -> tuple[int | None, str]:
    """The tokens the trainer will process (:func:`~satmon.drivers.counting.planned_tokens`): its estimated optimizer
    steps (``max_steps``, or the epochs' batches over ``accumulate_grad_batches``), the dataloader's batch size, the
    accumulation and the world size; or ``(None, why not)``. Never raises."""
    try:
        steps = trainer.estimated_stepping_batches
    except Exception as e:  # an iterable dataset without max_steps, a misconfigured limit: unknown, never a failed run
        return None, f"the trainer could not estimate its optimizer steps ({type(e).__name__}): set max_steps"
    loader = trainer.train_dataloader
    first = (
        next(iter(loader.values()))
        if isinstance(loader, dict) and loader
        else (loader[0] if isinstance(loader, (list, tuple)) and loader else loader)
    )
    return planned_tokens(
        steps, getattr(first, "batch_size", None), first, trainer.accumulate_grad_batches, trainer.world_size
    )
