"""``Screen``: the object a training loop drives. It attaches the hooks, counts the window, makes the
verdict, runs the collapse watch and applies the abort policy, for the Lightning callback, a plain
PyTorch loop or any other trainer. Cross-rank agreement goes through an :class:`Agreement`; the
readings go to a :class:`~satmon.io.sink.Sink` (TensorBoard files with ``logdir=``).

What the screen owns, each a collaborator with explicit inputs: the hook sets and device states
(:mod:`satmon.observe`), the collapse watch (:mod:`satmon.screen.watch`), the non-finite guard, the
stop policy (it decides; the screen logs and acts) and the checkpoint state (:mod:`satmon.screen.state`).

The window counts with the same hook sets as :func:`satmon.probe` (:class:`~satmon.observe.reading_hooks.ReadingHooks`)
and its verdict comes from the same :class:`~satmon.results.reading.Reading` -> verdict function
(:func:`~satmon.results.reading.verdict_of`). A verdict made because training ended early is provisional
(trust ``"partial"``): a checkpoint keeps its counts, and a resume continues the window.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from os import PathLike
from typing import Any

import torch
from torch import nn

from satmon.batches import ForwardFn, feed
from satmon.convert import check_conversion, pending_conversion
from satmon.functional.loss import loss_trend
from satmon.io import tensorboard as tb
from satmon.io.sink import MultiSink, NullSink, Sink, check_sink
from satmon.model.dataflow import LiveTrace
from satmon.model.discovery import NormLayer
from satmon.model.dyt_init import dyt_parameter_problems
from satmon.model.gating import detect_gating
from satmon.model.map import ModelMap, model_map
from satmon.model.weak import WeakModel
from satmon.observe.counters import SaturationCounter
from satmon.observe.gate import GateCounter, GateHooks
from satmon.observe.hookset import paused
from satmon.observe.offset import OffsetHooks
from satmon.observe.reading_hooks import ReadingHooks, nonfinite_parameters
from satmon.observe.saturation import HookReadings, SaturationHooks
from satmon.observe.window_loss import WindowLoss
from satmon.results.card import plain
from satmon.results.forecast import Forecast, family_of, run_forecast, with_model
from satmon.results.gating import GatingInfo
from satmon.results.reading import Reading, verdict_of
from satmon.results.stop import StopReason, breaches
from satmon.results.verdict import Source, Verdict
from satmon.screen.agreement import Agreement, TorchDistributed
from satmon.screen.changes import FollowingChanges
from satmon.screen.final_norm import FinalNorm
from satmon.screen.nonfinite_guard import NonFiniteGuard
from satmon.screen.state import COUNTS, ScreenState, WindowState, load_window_state, read_window_state, restore_plan
from satmon.screen.stop_policy import StopPolicy
from satmon.screen.trap import TrapWatch, with_trap_hparam
from satmon.screen.watch import CollapseWatch, LossHistory
from satmon.screen.watching import Watching
from satmon.settings import Settings, settings_from

__all__ = ["Screen", "running_scalars"]

_OWN = ("sink", "logdir", "agreement", "info", "warn", "verbose", "log_every_n_steps")


def _print_rank_zero(text: str) -> None:
    if (
        not (torch.distributed.is_available() and torch.distributed.is_initialized())
        or torch.distributed.get_rank() == 0
    ):
        print(text)


def _warn(text: str) -> None:
    warnings.warn(text, UserWarning, stacklevel=3)


def _feed_args(model: nn.Module, batch: tuple[tuple, dict]) -> Any:
    args, kwargs = batch
    return model(*args, **kwargs)


def running_scalars(r: HookReadings, names: Sequence[str]) -> dict[str, float]:
    """The window's readings under their tags: pooled and per-layer saturation, alpha, non-finite inputs.

    Example:
        >>> r = HookReadings(saturated=[1, 3], total=[4, 4], nonfinite=[0, 0], alphas=[2.0, 0.5])
        >>> running_scalars(r, ["a", "b"])["Satmon/saturation"]
        0.5
    """
    n = sum(r.total)
    return tb.window_scalars(
        sum(r.saturated) / n if n else 0.0, r.fractions(names), dict(zip(names, r.alphas)), sum(r.nonfinite)
    )


class Screen(Watching, FollowingChanges):
    """Screen a DyT model over its first ``window`` optimizer steps, then watch it.

    A plain loop calls :meth:`attach` once and :meth:`step` after each optimizer step (with the loss),
    then reads :attr:`verdict` and :attr:`should_stop`, and calls :meth:`detach` at the end. A
    framework driver (the Lightning callback) calls :meth:`begin_step` before each optimizer step's
    forwards and :meth:`end_step` after it instead. Settings are those of :class:`satmon.SaturationMonitor`
    (:class:`~satmon.settings.Settings`). What GO and NO-GO say and are worth: :data:`satmon.study.MEANING`,
    :data:`satmon.study.WORTH`.

    Args:
        settings: the validated settings, or pass them as keyword ``options`` (``window=500, ...``).
        sink: where the readings go (a :class:`~satmon.io.sink.Sink`: TensorBoard files, Lightning
            loggers, your own); it is the caller's to close.
        logdir: write TensorBoard files there (a :class:`~satmon.io.tensorboard.SummaryWriterSink` the
            screen makes, on rank zero, and closes at :meth:`detach`); with ``sink`` too, both are written.
        agreement: how ranks agree (default: ``torch.distributed`` when initialised, else one process).
        info: where console lines go (default: print to stdout on rank zero).
        warn: where warnings go (default: ``warnings.warn``).
        verbose: when the verdict is made, print its plain-text card (:meth:`Verdict.text`) instead of the one line
            printed by default (:meth:`Verdict.summary`: decision, trust, saturation vs threshold, where the card went).
        log_every_n_steps: how often the running saturation is logged (and read from the device).

    Example:
        >>> from satmon import DyT
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), DyT(4, alpha_init=2.0))
        >>> screen = Screen(window=2, info=lambda line: None).attach(model)  # the one line goes nowhere here
        >>> for _ in range(3):
        ...     loss = model(torch.randn(8, 4)).square().mean()  # forward (+ backward, optimizer step)
        ...     stop = screen.step(loss)                         # once per optimizer step
        >>> screen.verdict.window, screen.verdict.elements
        (2, 64)
        >>> print(screen.card().splitlines()[0][:21])
        satmon verdict: NO-GO
    """

    #: held weakly (:mod:`satmon.model.weak`): a screen its user keeps does not keep the model alive
    _model = WeakModel()

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        sink: Sink | None = None,
        logdir: str | PathLike | None = None,
        agreement: Agreement | None = None,
        info: Callable[[str], None] | None = None,
        warn: Callable[[str], None] | None = None,
        verbose: bool = False,
        log_every_n_steps: int = 50,
        **options: Any,
    ) -> None:
        self.settings = settings_from(
            settings,
            options,
            owner="Screen",
            own=_OWN,
            hint="A model without DyT gets no screen and a warning; there is no on_missing option here.",
        )
        self._own_sink = tb.SummaryWriterSink(logdir) if logdir is not None else None
        given = [check_sink(sink)] if sink is not None else []
        sinks = [*given, *([self._own_sink] if self._own_sink is not None else [])]
        #: where the readings go (a driver may set it: the Lightning callback's loggers)
        self.sink: Sink = sinks[0] if len(sinks) == 1 else MultiSink(*sinks) if sinks else NullSink()
        self.agreement = agreement or TorchDistributed()
        self.info, self.warn = info or _print_rank_zero, warn or _warn
        self.verbose, self.log_every_n_steps = Settings.check_flag("verbose", verbose), log_every_n_steps
        #: called as ``on_watch_check(reading, watch)`` after every watch check (a study that scores other rules on
        #: the same checks records them: ``satmon grid``); ``None``: nobody listens
        self.on_watch_check: Callable[[Any, CollapseWatch], None] | None = None
        self._reset_run()

    def _reset_run(self) -> None:
        """Everything one run of the screen holds (hooks, counts, verdict, stop, notes): as a new screen has it."""
        self.layers: list[NormLayer] = []
        self.gating: GatingInfo | None = None
        # made at attach (:meth:`_build`): the window's hooks and states, the watch, the guard (None: off)
        # the window's hook sets (saturation, offset, gate), read as one Reading
        self.reader: ReadingHooks | None = None
        self.hooks: SaturationHooks | None = None
        self.window_loss: WindowLoss | None = None
        self.losses: LossHistory | None = None  # the watch's loss history
        self.offset_hooks: OffsetHooks | None = None
        self.gate_hooks: GateHooks | None = None
        self.watch: CollapseWatch | None = None
        self.trap: TrapWatch | None = None  # the trap watch, from step 1 (settings.trap_every_n_steps; None: off)
        self._final: FinalNorm | None = None  # the final norm's kind for the forecast, by a forward's module order
        self.guard: NonFiniteGuard | None = None
        self.verdict: Verdict | None = None
        self.reading: Reading | None = None  # what the verdict was made from
        self.policy = StopPolicy(self.settings)
        self.steps_seen = 0
        self.first_step = 0  # the step counting (re)started at: not 0 after a resume that dropped the counts
        self.notes: list[str] = []
        #: the forecast from the planned passes, shown beside the decision; a driver that sees the trainer sets it at
        #: train start, else the screen makes it from ``settings.unique_tokens`` and ``settings.planned_tokens``
        self.forecast: Forecast | None = None
        self.status = "not attached"
        self._window_over = False  # attached after the window's end with nothing counted: no verdict to make
        self._last_step = -1
        self._steps_done = 0  # optimizer steps, for plain loops that call step()
        self._loaded: ScreenState | None = None  # a checkpoint's state, restored at attach
        # its counts are this process's own (a new session of the run), not summed over ranks
        self._loaded_local = False
        self._model = None  # the model attached to (its weights are checked at the verdict)
        self._n_params = 0  # its parameter count at attach, for a forecast made once it is gone
        # modules that change during the window: the model map flags a registration (O(1) a step); layers that
        # appear (added, or another module under a counted name) are counted by hook sets of their own
        self._map: ModelMap | None = None
        self._counted: dict[str, nn.Module] = {}  # layer name -> the module now counted under it
        self._late: list[SaturationHooks] = []  # the hook sets of layers that appeared, oldest first
        self._keep_inputs = False
        # on modules just registered: follow the change at their first forward
        self._first_forward_hooks: list[Any] = []
        self._live: LiveTrace | None = None  # the gating trace of the first training forward, while it waits
        self._check_hook: Any = None  # checks a fresh conversion on the first forward's batch
        self._saved_gate: Any = None  # a checkpoint's gate statistics, kept until the trace makes the gate hooks

    # ------------------------------------------------------------------------------- life cycle
    @property
    def layer_names(self) -> list[str]:
        return [l.name for l in self.layers]

    @property
    def active(self) -> bool:
        """Whether the model has DyT layers to screen."""
        return bool(self.layers)

    def discover(
        self, model: nn.Module, example_input: Any = None, forward_fn: ForwardFn | None = None, gating: bool = True
    ) -> list[NormLayer]:
        """Find the DyT layers and (with ``gating``) what they feed; no hooks yet. An empty list: nothing to screen.

        With ``example_input`` (a batch; ``forward_fn(model, batch)`` feeds it) gating is read from
        the data flow of one traced eval forward; without it (or where that forward fails) it is
        "unknown" until :meth:`attach` reads the first training forward."""
        s = self.settings
        self.layers = model_map(model).layers(("dyt",), include=s.include, exclude=s.exclude)
        if not self.layers:
            self.status = "no DyT layer: the saturation screen is off"
            return []
        if not gating:
            return self.layers
        self.gating = detect_gating(
            model,
            norm_names=self.layer_names,
            mapping=dict(s.gating_mapping or {}),
            example_input=example_input,
            forward_fn=forward_fn,
        )
        # untraced: the first training forward says
        if self.gating.gated is None and model_map(model).trace is not None:
            self.warn(f"satmon: {self.gating.message}")
        self.status = "discovered"
        return self.layers

    def attach(
        self,
        model: nn.Module,
        step: int = 0,
        keep_inputs: bool | None = None,
        example_input: Any = None,
        forward_fn: ForwardFn | None = None,
    ) -> Screen:
        """Attach the hooks to ``model`` (after any wrapping: DDP, FSDP, compile) at optimizer step ``step``.

        Args:
            model: the model (the one whose forwards train).
            step: optimizer steps already done (a resumed run).
            keep_inputs: keep the DyT inputs and count them when ``model``'s forward returns (or at
                :meth:`count_kept`), before the backward: cheaper than counting in each layer's hook on a
                CPU. Default (``None``): on a CPU model.
            example_input: a batch for the gated-MLP trace (optional; every rank must pass one under
                FSDP, whose traced forward runs collectives), fed by ``forward_fn``. Without it (or where
                that forward fails) gating is read from the first training forward as it runs, and the
                gate statistics start at the next forward. Layers :func:`satmon.convert_to_dyt` just made
                are checked on this batch (or on the first forward's) before anything is counted.
            forward_fn: how ``example_input`` reaches the model (default :func:`satmon.batches.feed`).

        Attached again to the same model (a second training session: the Lightning callback's second ``fit``), the
        run goes on as a resume from the end of the first would, from this process's own counts: a partial window
        continues, a made verdict stays. A window already over at ``step`` with nothing counted gives no verdict,
        and :meth:`card` says why.

        Raises:
            RuntimeError: the screen was attached to another model before (make a new Screen for it).
        """
        if self.hooks is not None:  # attached before: another training session of the same run (a second fit)
            self._new_session(model)
        names = self.layer_names
        if example_input is not None:  # a model just converted to DyT runs this batch before anything is counted
            check_conversion(model, example_input, forward_fn or feed, warn=self.warn)
        if not self.discover(model, example_input, forward_fn) and not names:
            self.status = (
                f"no DyT layer in {type(model).__name__}, so there is no screen and no verdict. Convert the norms "
                "with satmon.convert_to_dyt(model), or select your DyT layers with include=."
            )
            self.warn(f"satmon: {self.status}")
            return self
        if names and self.layer_names != names:
            raise RuntimeError(f"Expected the same DyT layers as at discovery ({names}), got {self.layer_names}.")
        # before the window, not in its verdict
        for problem in dyt_parameter_problems((l.name, l.module) for l in self.layers):
            self.warn(f"satmon: DyT layer {problem}")
        # once, at attach
        alphas = [float(l.module.alpha.detach().float().mean()) for l in self.layers] if step == 0 else []
        self._alpha_init = (min(alphas), max(alphas)) if alphas else self._loaded.alpha_init if self._loaded else None
        self._build(model, keep_inputs)
        assert self.hooks is not None and self.reader is not None
        self._map = model_map(model)
        if self._map.trace is None:  # gating from the first training forward, as it runs: no extra forward
            self._live = self._map.trace_live(self._traced)
            if example_input is None and pending_conversion(model):
                self._check_hook = model.register_forward_pre_hook(
                    self._check_first_batch, with_kwargs=True, prepend=True
                )
        self._map.listen(self._registered)
        self._counted, self._late = {l.name: l.module for l in self.layers}, []
        dropped = None
        if self._loaded is not None:
            dropped = self._restore(self._loaded)
            self._loaded, self._loaded_local = None, False
            if self.verdict is not None and self.verdict.partial:
                # a provisional verdict (training ended before the window closed): its counts are restored, and
                # the window goes on from them; the verdict is made again when it closes
                self.verdict = None
        self._last_step = self._steps_done = step
        window = self.settings.window
        if self.verdict is None and step < window:
            self.reader.attach()
            tb.add_layout(self.sink)
            self.status = "screening"
        elif self.verdict is None and self.steps_seen > self.first_step:
            self._close_at_resume(step)
        else:
            if self.verdict is None:
                self._no_window_left(step, dropped)
            self._start_watch()
        if self.trap is not None:  # from the first step, window or not; after the window's hooks (they refuse first)
            self.trap.attach()
        self._final = FinalNorm(model).attach()
        self.begin_step(step)
        return self

    def _new_session(self, model: nn.Module) -> None:
        """The screen is attached again (a second ``fit`` of the same Trainer and model, after it ended or raised): the
        run goes on as a resume from a checkpoint saved at the end of the first would, from this process's own counts
        (no collective: every rank does the same with its own). A checkpoint loaded since (:meth:`load_state_dict`)
        takes their place. Another model is refused: its counts and verdict would be mixed with this one's."""
        if self._model is not model:
            first = type(self._model).__name__ if self._model is not None else "since freed"
            raise RuntimeError(
                f"Expected the model this screen was attached to ({first}), got another "
                f"one ({type(model).__name__}): a Screen screens one run of one model, and this one holds "
                "the first model's counts and verdict. Make a new Screen for the other model."
            )
        loaded, local = self._loaded, False
        if loaded is None:
            loaded, local = ScreenState.from_dict(self.state_dict(sync=False)), True
        self.detach()
        self._reset_run()
        self._load(loaded, local)

    def _no_window_left(self, step: int, dropped: str | None) -> None:
        """Attached at or after the window's end with nothing counted in it: no verdict, and the card says why."""
        self._window_over = True
        why = f"the counts saved before were dropped ({dropped})" if dropped else "nothing had been counted before"
        self.status = (
            f"the window ({self.settings.window} optimizer steps) was over when the screen attached at step "
            f"{step}, and {why}: nothing is left to count, so there is no verdict."
        )
        if not dropped:  # a dropped count was warned about by the resume already: one warning
            self.warn(
                f"satmon: {self.status} satmon screens the first `window` optimizer steps of a run: attach it from "
                f"the start (or resume from a checkpoint that holds its state), or set `window` above {step}."
            )

    def _close_at_resume(self, step: int) -> None:
        """Resumed with a window no longer than the steps already counted: the window is over, so the verdict
        is made now, on every step counted (the resume's note, :func:`~satmon.screen.state.restore_plan`, says so)."""
        self.conclude(step)

    def _build(self, model: nn.Module, keep_inputs: bool | None) -> None:
        """Make (not attach) every hook set and device state the settings ask for, on the DyT layers' device
        (``keep_inputs=None``: kept on a CPU model, counted when ``model``'s forward returns)."""
        s, layers = self.settings, self.layers
        device = layers[0].module.alpha.device
        n = len(layers)
        keep = device.type == "cpu" if keep_inputs is None else keep_inputs
        self._model, self._keep_inputs = model, keep
        self._n_params = sum(p.numel() for p in model.parameters())
        # the window's hook sets: the same as a probe's (satmon.observe.reading_hooks)
        self.reader = ReadingHooks(
            model,
            layers,
            self.gating,
            level=s.level,
            product=s.product,
            offset=bool(s.offset_every),
            keep_inputs=keep,
            root=model,
        )
        self.hooks, self.offset_hooks, self.gate_hooks = self.reader.saturation, self.reader.offset, self.reader.gate
        hooks = self.hooks
        self.window_loss = WindowLoss(s.window).to(device)
        self.losses = self.watch = None
        if s.watch_every_n_steps:
            self.losses = LossHistory(s.loss_baseline + s.watch_every_n_steps, device=device)
            watch_hooks = SaturationHooks(
                layers,
                SaturationCounter(n, level=s.level, product=s.product).to(device),
                keep,
                refused=hooks.refused,
                root=model,
            )
            self.watch = self._make_watch(watch_hooks)
        self.guard = NonFiniteGuard(device) if breaches(s.abort_on, StopReason.NONFINITE) else None
        self.trap = (
            TrapWatch(model, layers, s.trap_every_n_steps, s.trap_patience, s.trap_floor, s.level, hooks.refused)
            if s.trap_every_n_steps
            else None
        )

    # ------------------------------------------------------------------------------- the first training forward
    def _traced(self, m: ModelMap) -> None:
        """The first training forward was read (:class:`~satmon.model.dataflow.LiveTrace`): gating from it, then
        the gate hooks and the watch on what it found (the gate statistics count from the next forward)."""
        self._live = None
        model = self._model
        if model is None or self.reader is None:
            return
        s = self.settings
        self.gating = detect_gating(model, norm_names=self.layer_names, mapping=dict(s.gating_mapping or {}))
        if self.gating.gated is None:
            self.warn(f"satmon: {self.gating.message}")
        self.reader.gating = self.gating
        pairings = self.gating.pairings
        if pairings and self.gate_hooks is None:
            gate = GateHooks(model, self.gating, GateCounter(len(pairings)).to(self.layers[0].module.alpha.device))
            if self._saved_gate is not None and self.agreement.rank == 0:  # a resume's statistics, counted before
                load_window_state(gate.counter, self._saved_gate)
            self.reader.gate = self.gate_hooks = gate
            if self.reader.attached:  # the window is open
                gate.attach()
        self._saved_gate = None
        if self.watch is not None:  # its streaks, log and saturation hooks stay (it may run in the window)
            self._gate_watch(self.watch)

    def _check_first_batch(self, model: nn.Module, args: tuple, kwargs: dict) -> None:
        """The first forward of a model just converted to DyT: its batch checks the conversion (layers that cannot
        run as DyT are put back) before this forward runs; nothing is counted meanwhile."""
        self._check_hook.remove()
        self._check_hook = None
        with self.paused():
            check_conversion(model, (args, kwargs), _feed_args, warn=self.warn)

    def _stop_tracing(self) -> None:
        if self._live is not None:
            self._live.cancel()
            self._live = None
        if self._check_hook is not None:
            self._check_hook.remove()
            self._check_hook = None

    def detach(self) -> None:
        """Remove every hook and close the TensorBoard files the screen opened (``logdir=``); the counts
        and the verdict stay (a later write opens the files again)."""
        for h in (self.hooks, self.gate_hooks, self.watch, self.offset_hooks, self.trap, self._final, *self._late):
            if h is not None:
                h.detach()
        self._stop_tracing()
        if self._own_sink is not None:
            self._own_sink.close()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No counting inside the block (validation, a probe's forwards)."""
        with paused(
            self.hooks,
            self.gate_hooks,
            self.offset_hooks,
            *(self.watch.hook_sets() if self.watch else ()),
            *self._late,
            *(self.trap.paused_sets() if self.trap else ()),
            *(self._final.paused_sets() if self._final else ()),
        ):
            yield

    # ------------------------------------------------------------------------------- per step
    def begin_step(self, step: int) -> None:
        """Before the forwards of optimizer step ``step`` (steps done so far): choose what counts."""
        if self.hooks is None:
            return
        if self.trap is not None:
            self.trap.select(step)
        if self._final is not None:
            self._final.settle()
        if self.hooks.attached:
            if self._map is not None and self._map.changed():  # O(1): a module was registered under the model
                self._follow_changes(step)
            k = self.settings.sample_every
            if k > 1:
                self.hooks.enabled = step % k == 0
            for h in self._count_sets():
                self._follow_sampling(h)
            if self.offset_hooks is not None:  # sampled: a float64 pass over the inputs
                self.offset_hooks.enabled = self.hooks.enabled and (step // k) % self.settings.offset_every == 0
            self._select_in_window(step)  # the collapse watch from settings.watch_start, beside the window
        elif self.watch is not None and self.watch.hooks.attached:
            self.watch.select(step)

    def count_kept(self) -> None:
        """Count inputs kept during the forward (CPU); call after the forward, before the optimizer step."""
        for h in (self.hooks, self.watch.hooks if self.watch else None, *self._late):
            if h is not None:
                h.count_kept()

    def push_loss(self, loss: Any) -> None:
        """Record a training loss (a 1-element tensor; kept on its device, no host sync)."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        if self.losses is not None:  # the watch's loss history (no watch, no history)
            self.losses.push(loss)
        if self.window_loss is not None and self.verdict is None:
            self.window_loss.push(loss, max(self._last_step, 0))  # the step this loss belongs to

    def end_step(self, step: int, loss: Any = None) -> None:
        """After an optimizer step; ``step`` = optimizer steps done. Mid-accumulation calls only record the loss.

        Every rank must call it at every step: the window's end, running readings, watch checks and
        the non-finite guard are cross-rank operations taken at the same step on every rank.
        """
        self.push_loss(loss)
        if self.hooks is None or step == self._last_step:
            return
        self._last_step = step
        if self.verdict is None and not self._window_over:  # counted, whatever stops the run at this step's end
            self.steps_seen = min(step, self.settings.window)
        if self._live is not None:
            self._live.finish()  # a training step that called submodules, not the model: what ran is read
        if self.guard is not None:
            self._guard_step(step, loss)
        if self.trap is not None and self.trap.measuring:
            self._trap_check(step)
        if self.should_stop and self.stop is not None and self.stop.step != step:
            return  # stopped at an earlier step: nothing more is read
        if self.watch is not None and self.watch.measuring and not self.should_stop:  # from settings.watch_start
            self._watch_check(step)
        if self.verdict is not None or self._window_over:
            return
        if step >= self.settings.window:  # the window's end: its verdict, on a step that stopped the run too
            self.conclude(step)
        elif step % self.log_every_n_steps == 0:
            tb.log_scalars(self.sink, running_scalars(self.hooks.read(sync=True), self.layer_names), step)

    def step(self, loss: Any = None) -> bool:
        """One optimizer step done (plain loops): end it, prepare the next; returns :attr:`should_stop`."""
        if self.status == "not attached" and self._steps_done == 0:  # once: a loop that forgot attach() counts nothing
            self.warn(
                "satmon: Screen.step() was called before Screen.attach(model): nothing is counted and no verdict "
                "will come. Call screen.attach(model) before the training loop."
            )
        if self.hooks is not None and self._model is None:  # attached, and the model was freed since
            raise RuntimeError(
                "Expected the model this screen is attached to to be alive at Screen.step(), got one that was freed "
                "(the screen holds it weakly): call step() after each optimizer step while the model trains; once "
                "it is freed, call screen.finish() and read the card (the screen keeps what it counted)."
            )
        self._steps_done += 1
        self.end_step(self._steps_done, loss)
        self.begin_step(self._steps_done)
        return self.should_stop

    def finish(self, step: int | None = None) -> None:
        """Training ended. A window cut short gets a partial verdict from THIS process's counts: no
        collective here, since another rank may have stopped elsewhere (uneven data) and would never join."""
        step = self._steps_done if step is None else step
        if self.hooks is not None and self.verdict is None and self.steps_seen > 0 and not self._window_over:
            self.warn(
                f"satmon: training ended after {self.steps_seen} of the {self.settings.window} window steps; the "
                "verdict is provisional (trust 'partial'): resuming from a checkpoint saved from here on continues "
                "the window. Lower `window` or train longer."
            )
            notes = []
            if self.agreement.world_size > 1:
                notes.append(
                    f"training ended before the window closed: counts of rank {self.agreement.rank} only "
                    "(no cross-rank sum at the end of training, where ranks may not all be present)"
                )
            self.conclude(step, partial=True, sync=False, extra_notes=notes)

    # ------------------------------------------------------------------------------- verdict
    def conclude(
        self, step: int, partial: bool = False, sync: bool = True, extra_notes: Sequence[str] = ()
    ) -> Verdict | None:
        """Make the verdict from the window's counts (summed over ranks with ``sync``), log it, detach the
        window hooks, apply the policy (a full window only; a ``partial`` verdict is provisional)."""
        self.verdict = self._window_verdict(step, partial, sync, extra_notes)
        if self.verdict is not None and not partial:
            self._verdict_policy(step)
        return self.verdict

    def read(self, step: int, sync: bool = True, extra_notes: Sequence[str] = ()) -> Reading:
        """The window's reading so far (counts, offset and gate readings, loss trend, non-finite weights), with
        ``sync`` summed over ranks (collectives: every rank must call it at the same point)."""
        assert self.reader is not None
        return self._read(step, sync, extra_notes)[1]

    def _read(
        self, step: int, sync: bool, extra_notes: Sequence[str], final: bool = False
    ) -> tuple[HookReadings, Reading]:
        assert self.reader is not None and self.hooks is not None
        s = self.settings
        # collectives, in the same order on every rank: counts, states, weights
        counts, names = self._window_readings(sync, final=final)
        loss = loss_trend(self.window_loss.means(sync=sync)) if self.window_loss is not None else None
        weights = (
            nonfinite_parameters(self._model, self.agreement.max if sync else None) if self._model is not None else {}
        )
        layers = {l.name: l for h in self._count_sets() for l in h.layers}  # a replaced layer: its latest module
        reading = self.reader.read(
            step=step,
            source=Source.WINDOW.value,
            sync=sync,
            counts=counts,
            layers=[layers[n] for n in names],
            window=self.steps_seen - self.first_step,
            planned_window=s.window,
            offset_every=s.offset_every,
            loss=loss,
            nonfinite_weights=weights,
            notes=[*self.notes, *extra_notes],
        )
        return counts, reading

    def _window_verdict(self, step: int, partial: bool, sync: bool, extra_notes: Sequence[str]) -> Verdict | None:
        """Read every window count once, detach the window's hooks, build and log the verdict."""
        assert self.reader is not None
        if self._map is not None:
            self._follow_changes(step, at_end=True)  # one walk over the modules: removals no hook sees (del)
        counts, reading = self._read(step, sync, extra_notes, final=True)
        self.reader.detach()
        self._drop_first_forward_hooks()
        if self.gate_hooks is not None and not partial:
            self.gate_hooks.counter.reset()  # the watch reads the gates afresh; a provisional verdict keeps them
        self.reading = reading
        verdict = verdict_of(reading, self.settings.rule)
        if verdict is None:
            self.status = "window over: no DyT input was counted"
            self.warn(f"satmon: no DyT input was counted in the window ({self.steps_seen} steps): no verdict.")
            return None
        verdict = replace(verdict, planned_forecast=self._planned_forecast().to_dict())
        tb.log_scalars(
            self.sink, {**running_scalars(counts, list(reading.counts)), **tb.offset_scalars(reading.offset)}, step
        )
        where = tb.log_verdict(with_trap_hparam(self.sink, self.trap), verdict)
        # one line by default (decision, trust, saturation vs threshold, where the card went); the card with verbose
        self.info("\n" + verdict.text() + "\n" if self.verbose else verdict.summary(where))
        self.status = (
            "verdict made" if not partial else "provisional verdict made (training ended before the window closed)"
        )
        return verdict

    def _planned_forecast(self) -> Forecast:
        """The forecast the card shows beside the decision: the driver's, else one from the settings' token counts."""
        s = self.settings
        model = self._model
        params = sum(p.numel() for p in model.parameters()) if model is not None else self._n_params
        f = (
            self.forecast
            if self.forecast is not None
            else run_forecast(
                params,
                s.unique_tokens,
                s.planned_tokens,
                "a Screen does not see the training data",
                "a Screen does not see the trainer's steps and batch",
                s.planned_steps,
                s.warmup_steps,
                s.lr_schedule,
            )
        )
        # the family by what the model computes (its traced gating), DyT's alpha at attach and the final norm's kind
        # (the last normaliser to start in a forward): known only now
        family = family_of(self.gating.gated if self.gating is not None else None)
        # (a compiled model's forward records nothing: the setting, where given, stands in)
        final = (self._final.kind if self._final is not None else None) or s.final_norm
        return with_model(f, family, getattr(self, "_alpha_init", None), final)

    def card(self, markdown: bool = False) -> str:
        """The verdict's card in plain text (``markdown``: as TensorBoard shows it), or, without a verdict,
        what the screen is doing and why there is none (a model without DyT, a window still open...).

        Works whatever the model: ``print(screen.card())`` never raises where ``screen.verdict`` is ``None``.
        """
        if self.verdict is not None:
            return self.verdict.card() if markdown else self.verdict.text()
        if self.status == "screening":
            why = (
                f"the window is open: {self.steps_seen} of its {self.settings.window} optimizer steps counted; the "
                f"verdict comes at step {self.settings.window}."
            )
        elif self.status == "not attached":
            why = (
                "the screen is not attached to a model yet (Screen.attach(model), or the callback at the first batch)."
            )
        else:
            why = self.status
        title = "no verdict" if self.active or self.status == "not attached" else "no screen"
        trap = self.trap.last if self.trap is not None and self.trap.named_step is not None else None
        text = f"### satmon: {title}\n\n{why}" + (f"\n\n{trap.line().removeprefix('satmon: ')}" if trap else "")
        return text if markdown else plain(text)

    # ------------------------------------------------------------------------------- state
    def _window_states(self) -> tuple[tuple[str, WindowState | None], ...]:
        """The window's states kept in checkpoints beside the counts (``None``: off), in
        :data:`~satmon.screen.state.EXTRA_STATES` order."""
        return (
            ("loss_segments", self.window_loss),
            ("offset", self.offset_hooks.counter if self.offset_hooks else None),
            ("gate", self.gate_hooks.counter if self.gate_hooks else None),
        )

    def state_dict(self, sync: bool = True) -> dict[str, Any]:
        """What a checkpoint keeps (:class:`~satmon.screen.state.ScreenState`): the window's counts (summed
        over ranks with ``sync``: every rank must call it), settings, verdict, stop. Before :meth:`attach`,
        a loaded state passes through."""
        common = dict(
            steps_seen=self.steps_seen,
            first_step=self.first_step,
            verdict=self.verdict,
            stop=self.stop,
            alpha_init=getattr(self, "_alpha_init", None) or (self._loaded.alpha_init if self._loaded else None),
        )
        if self.hooks is None:  # not attached (yet): a loaded state passes through, with the settings of its counts
            loaded = self._loaded or ScreenState(ScreenState.saved_settings(self.settings), ())
            state = ScreenState(
                loaded.settings,
                tuple(self.layer_names) or loaded.layers,
                notes=(*loaded.notes, *self.notes),
                counts=loaded.counts,
                extras=loaded.extras,
                **common,
            )
            return state.to_dict()
        # collectives, in the same order on every rank: counts (with those of layers that appeared), then each state
        r, names = self._window_readings(sync, final=False)
        extras = {key: read_window_state(m, sync) for key, m in self._window_states() if m is not None}
        if self.trap is not None:  # decided from reduced readings: the same on every rank, no collective
            extras["trap"] = self.trap.state_dict()
        if self.watch is not None:  # likewise
            extras["collapse"] = self.watch.state_dict()
        return ScreenState(
            ScreenState.saved_settings(self.settings),
            tuple(names),
            notes=tuple(self.notes),
            counts=(tuple(r.saturated), tuple(r.total), tuple(r.nonfinite)),
            extras=extras,
            **common,
        ).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a saved state back (a dict from :meth:`state_dict`); the counts are restored at :meth:`attach`."""
        self._load(ScreenState.from_dict(state), local=False)

    def _load(self, saved: ScreenState, local: bool) -> None:
        """Hold ``saved`` until :meth:`attach` restores it (``local``: its counts are this process's own)."""
        self._loaded, self._loaded_local = saved, local
        self.steps_seen, self.first_step, self.verdict = saved.steps_seen, saved.first_step, saved.verdict
        self.policy = StopPolicy(self.settings, stop=saved.stop)

    def _restore(self, saved: ScreenState) -> str | None:
        """Put a saved state into the attached screen, as :func:`~satmon.screen.state.restore_plan` decides
        (rank zero takes the saved sums: they were summed over ranks; a new session's own counts stay on each rank).
        Returns why the saved counts were dropped, if they were."""
        assert self.hooks is not None
        plan = restore_plan(saved, self.settings, self.layer_names, self.steps_seen)
        for message in plan.warnings:
            self.warn(message)
        self.notes.extend(plan.notes)
        if plan.restart:
            self.first_step = self.steps_seen
        for key, part in (("trap", self.trap), ("collapse", self.watch)):  # every rank: the same everywhere
            if part is not None and key in saved.extras:
                try:
                    part.load_state_dict(saved.extras[key])
                except (TypeError, ValueError, IndexError, AttributeError) as e:
                    self.warn(
                        f"satmon: the checkpoint's saved {key!r} state is not readable ({type(e).__name__}: {e}; "
                        f"expected what satmon saved, got {saved.extras[key]!r:.80}): it is ignored and that watch "
                        "starts afresh (what it said before the checkpoint may be said again)."
                    )
        if plan.counts is None or (self.agreement.rank != 0 and not self._loaded_local):
            return plan.dropped
        for k, v in zip(COUNTS, plan.counts):
            getattr(self.hooks.counter, k).copy_(torch.tensor(v, dtype=torch.int64))
        for key, metric in self._window_states():
            if metric is not None and key in saved.extras:
                load_window_state(metric, saved.extras[key])
        if self.gate_hooks is None and "gate" in saved.extras:  # gating comes with the first training forward
            self._saved_gate = saved.extras["gate"]
        return plan.dropped
