"""``Screen``: the object a training loop drives. It attaches the hooks, counts the window, makes the
verdict, runs the collapse watch and applies the abort policy, for the Lightning callback, a plain
PyTorch loop or any other trainer. Cross-rank agreement goes through an :class:`Agreement`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from satmon.batches import ForwardFn
from satmon.results.stop import StopReason, StopRecord
from satmon.screen.agreement import Agreement, TorchDistributed
from satmon.model.gating import GatingReport, detect_gating
from satmon.observe.hookset import paused
from satmon.screen.parts import build_parts
from satmon.screen.window_verdict import make_window_verdict, running_scalars, verdict_stop_reason
from satmon.observe.saturation import SaturationHooks
from satmon.screen.state import dump_state, restore_state
from satmon.screen.stop_policy import StopPolicy
from satmon.settings import Settings, settings_from
from satmon.model.discovery import NormLayer, find_dyt_layers
from satmon.results.verdict import Verdict
from satmon.io import tensorboard as tb

__all__ = ["Screen"]

_OWN = ("loggers", "logdir", "agreement", "info", "warn", "verbose", "log_every_n_steps")


def _print_rank_zero(text: str) -> None:
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or torch.distributed.get_rank() == 0:
        print(text)


def _warn(text: str) -> None:
    warnings.warn(text, UserWarning, stacklevel=3)


class Screen:
    """Screen a DyT model over its first ``window`` optimizer steps, then watch it.

    A plain loop calls :meth:`attach` once and :meth:`step` after each optimizer step (with the loss),
    then reads :attr:`verdict` and :attr:`should_stop`, and calls :meth:`detach` at the end. A
    framework driver (the Lightning callback) calls :meth:`begin_step` before each optimizer step's
    forwards and :meth:`end_step` after it instead. Settings are those of :class:`satmon.SaturationMonitor`
    (:class:`~satmon.settings.Settings`).

    Args:
        settings: the validated settings, or pass them as keyword ``options`` (``window=500, ...``).
        loggers: Lightning loggers to write to (a ``TensorBoardLogger`` works without a Trainer).
        logdir: write TensorBoard files there (a ``TensorBoardLogger`` made for you).
        agreement: how ranks agree (default: ``torch.distributed`` when initialised, else one process).
        info: where console lines go (default: print on rank zero).
        warn: where warnings go (default: ``warnings.warn``).
        verbose: print the verdict card when it is made.
        log_every_n_steps: how often the running saturation is logged (and read from the device).

    Example:
        >>> from satmon import DyT
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), DyT(4, alpha_init=2.0))
        >>> screen = Screen(window=2, verbose=False).attach(model)
        >>> for _ in range(3):
        ...     loss = model(torch.randn(8, 4)).square().mean()  # forward (+ backward, optimizer step)
        ...     stop = screen.step(loss)                         # once per optimizer step
        >>> screen.verdict.window, screen.verdict.elements
        (2, 64)
    """

    def __init__(self, settings: Settings | None = None, *, loggers: Sequence[Any] = (), logdir: str | None = None,
                 agreement: Agreement | None = None, info: Callable[[str], None] | None = None,
                 warn: Callable[[str], None] | None = None, verbose: bool = True, log_every_n_steps: int = 50,
                 **options: Any) -> None:
        settings = settings_from(settings, options, owner="Screen", own=_OWN, hint="A model without DyT gets no screen "
                                 "and a warning; there is no on_missing option here.")
        if logdir is not None:
            from lightning.pytorch.loggers import TensorBoardLogger  # the writer satmon's TensorBoard layout is made for

            loggers = [*loggers, TensorBoardLogger(logdir, name="", version="", default_hp_metric=False)]
        self.settings = settings
        self.loggers = list(loggers)
        self.agreement = agreement or TorchDistributed()
        self.info, self.warn = info or _print_rank_zero, warn or _warn
        self.verbose, self.log_every_n_steps = Settings.check_flag("verbose", verbose), log_every_n_steps
        self.layers: list[NormLayer] = []
        self.gating: GatingReport | None = None
        # built at attach (satmon.screen.parts): the window's hooks and states, the watch, the guard
        self.hooks: SaturationHooks | None = None
        self.gate_hooks = self.watch = self.losses = self.guard = self.window_loss = self.offset_hooks = None
        self.verdict: Verdict | None = None
        self.policy = StopPolicy(self.settings)
        self.steps_seen = 0
        self.first_step = 0  # the step counting (re)started at: not 0 after a resume that dropped the counts
        self.notes: list[str] = []
        self.status = "not attached"
        self._last_step = -1
        self._steps_done = 0  # optimizer steps, for plain loops that call step()
        self._loaded: dict[str, Any] | None = None

    # ------------------------------------------------------------------------------- life cycle
    @property
    def layer_names(self) -> list[str]:
        return [l.name for l in self.layers]

    @property
    def active(self) -> bool:
        """Whether the model has DyT layers to screen."""
        return bool(self.layers)

    def discover(self, model: nn.Module, example_input: Any = None, forward_fn: ForwardFn | None = None,
                 gating: bool = True) -> list[NormLayer]:
        """Find the DyT layers and (with ``gating``) what they feed; no hooks yet. An empty list: nothing to screen.

        With ``example_input`` (a batch; ``forward_fn(model, batch)`` feeds it) gating is read from
        the data flow of one traced eval forward; without it, from module names (a fallback that
        says "unknown" where it cannot tell)."""
        s = self.settings
        self.layers = find_dyt_layers(model, include=s.include, exclude=s.exclude)
        if not self.layers:
            self.status = "no DyT layer: the saturation screen is off"
            return []
        if not gating:
            return self.layers
        self.gating = detect_gating(model, norm_names=self.layer_names, mapping=dict(s.gating_mapping or {}),
                                    example_input=example_input, forward_fn=forward_fn)
        if self.gating.gated is None:
            self.warn(f"satmon: {self.gating.message}")
        self.status = "discovered"
        return self.layers

    def attach(self, model: nn.Module, step: int = 0, keep_inputs: bool | None = None, example_input: Any = None,
               forward_fn: ForwardFn | None = None) -> Screen:
        """Attach the hooks to ``model`` (after any wrapping: DDP, FSDP, compile) at optimizer step ``step``.

        Args:
            model: the model (the one whose forwards train).
            step: optimizer steps already done (a resumed run).
            keep_inputs: keep the DyT inputs and count them when ``model``'s forward returns (or at
                :meth:`count_kept`), before the backward: cheaper than counting in each layer's hook on a
                CPU. Default (``None``): on a CPU model.
            example_input: a batch for the gated-MLP trace (optional; every rank must pass one under
                FSDP, whose traced forward runs collectives), fed by ``forward_fn``.
            forward_fn: how ``example_input`` reaches the model (default :func:`satmon.batches.feed`).
        """
        names = self.layer_names
        if not self.discover(model, example_input, forward_fn) and not names:
            self.warn(f"satmon: no DyT layer in {type(model).__name__}, so there is no screen and no verdict. Convert the "
                      "norms with satmon.convert_to_dyt(model), or select your DyT layers with include=.")
            return self
        if names and self.layer_names != names:
            raise RuntimeError(f"Expected the same DyT layers as at discovery ({names}), got {self.layer_names}.")
        parts = build_parts(self.settings, self.layers, self.gating, model, keep_inputs)
        self.hooks, self.window_loss, self.losses = parts.hooks, parts.window_loss, parts.losses
        self.offset_hooks, self.gate_hooks, self.watch, self.guard = parts.offset_hooks, parts.gate_hooks, parts.watch, parts.guard
        if self._loaded is not None:
            self._restore(self._loaded)
            self._loaded = None
        self._last_step = self._steps_done = step
        if self.verdict is None and step < self.settings.window:
            self.hooks.attach()
            if self.offset_hooks is not None:
                self.offset_hooks.attach()
            if self.gate_hooks is not None:
                self.gate_hooks.attach()
            tb.add_layout(self.loggers, self.layer_names)
            self.status = "screening"
        else:
            self._start_watch()
        self.begin_step(step)
        return self

    def detach(self) -> None:
        """Remove every hook (the counts and the verdict stay)."""
        for h in (self.hooks, self.gate_hooks, self.watch, self.offset_hooks):
            if h is not None:
                h.detach()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No counting inside the block (validation, a probe's forwards)."""
        with paused(self.hooks, self.gate_hooks, self.offset_hooks, self.watch.hooks if self.watch else None):
            yield

    # ------------------------------------------------------------------------------- per step
    def begin_step(self, step: int) -> None:
        """Before the forwards of optimizer step ``step`` (steps done so far): choose what counts."""
        if self.hooks is None:
            return
        if self.hooks.attached:
            k = self.settings.sample_every
            if k > 1:
                self.hooks.enabled = step % k == 0
            if self.hooks.enabled:
                self.hooks.refresh_thresholds()  # one batched op per step instead of one per layer
            if self.offset_hooks is not None:  # sampled: a float64 pass over the inputs
                self.offset_hooks.enabled = self.hooks.enabled and (step // k) % self.settings.offset_every == 0
        elif self.watch is not None and self.watch.hooks.attached:
            self.watch.select(step)

    def count_kept(self) -> None:
        """Count inputs kept during the forward (CPU); call after the forward, before the optimizer step."""
        for h in (self.hooks, self.watch.hooks if self.watch else None):
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
        if self.guard is not None:
            self._guard_step(step, loss)
        if self.should_stop:
            return
        if self.verdict is not None:
            if self.watch is not None and self.watch.measuring:
                self._watch_check(step)
            return
        self.steps_seen = min(step, self.settings.window)
        if step >= self.settings.window:
            self.conclude(step)
        elif step % self.log_every_n_steps == 0:
            tb.log_scalars(self.loggers, running_scalars(self.hooks.read(sync=True), self.layer_names), step)

    def step(self, loss: Any = None) -> bool:
        """One optimizer step done (plain loops): end it, prepare the next; returns :attr:`should_stop`."""
        self._steps_done += 1
        self.end_step(self._steps_done, loss)
        self.begin_step(self._steps_done)
        return self.should_stop

    def finish(self, step: int | None = None) -> None:
        """Training ended. A window cut short gets a partial verdict from THIS process's counts: no
        collective here, since another rank may have stopped elsewhere (uneven data) and would never join."""
        step = self._steps_done if step is None else step
        if self.hooks is not None and self.verdict is None and self.steps_seen > 0:
            self.warn(f"satmon: training ended after {self.steps_seen} of the {self.settings.window} window steps; "
                      "the verdict rests on the shorter window. Lower `window` or train longer.")
            notes = []
            if self.agreement.world_size > 1:
                notes.append(f"training ended before the window closed: counts of rank {self.agreement.rank} only "
                             "(no cross-rank sum at the end of training, where ranks may not all be present)")
            self.conclude(step, partial=True, sync=False, extra_notes=notes)

    # ------------------------------------------------------------------------------- verdict
    def conclude(self, step: int, partial: bool = False, sync: bool = True, extra_notes: Sequence[str] = ()) -> Verdict | None:
        """Make the verdict from the window's counts, log it, detach the window hooks, apply the policy."""
        self.verdict = make_window_verdict(self, step, partial, sync, extra_notes)
        if self.verdict is not None and not partial:
            self._verdict_policy(step)
        return self.verdict

    def _verdict_policy(self, step: int) -> None:
        assert self.verdict is not None
        if self.verdict.collapse_risk and self.watch is not None:
            self.watch.streak[StopReason.COLLAPSE_RISK] = 1  # the verdict is the watch streak's first breach
        reason = verdict_stop_reason(self.verdict, self.settings)
        if reason is not None and self.request_stop(reason, self.verdict.reason, step):
            return
        self._start_watch()

    def _start_watch(self) -> None:
        if self.watch is not None:
            self.watch.start()
            self.status = "watching"

    def _watch_check(self, step: int) -> None:
        assert self.watch is not None
        reading = self.watch.check(step, self.agreement.max)
        tb.log_scalars(self.loggers, tb.watch_scalars(reading.nonfinite, reading.gated_saturation, reading.gate_stats,
                                                      reading.loss_z, reading.found), step)
        for reason, message in reading.due:
            if self.stop is None or self.stop.dry_run:
                if self.request_stop(reason, message, step):
                    return

    def _guard_step(self, step: int, loss: Any) -> None:
        assert self.guard is not None
        if self.hooks is not None and self.hooks.attached:
            self.hooks.flush()
            self.guard.push(self.hooks.counter.nonfinite.sum(), self.hooks.local_alphas(), loss, self.agreement.max)
        else:
            self.guard.push(None, None, loss, self.agreement.max)
        seen = self.guard.poll()
        if seen:
            self.request_stop(StopReason.NONFINITE, f"non-finite DyT input(s), alpha(s) or training loss on some rank "
                              f"({seen} so far, all ranks)", step)

    # ------------------------------------------------------------------------------- stopping
    def request_stop(self, reason: StopReason, message: str, step: int) -> bool:
        """Apply the abort policy with every rank; True when training must stop now."""
        return self.policy.request(reason, message, step, self.agreement, self.loggers, self.warn)

    @property
    def stop(self) -> StopRecord | None:
        """Why satmon stopped (or, in a dry run, would have stopped) the run."""
        return self.policy.stop

    @property
    def should_stop(self) -> bool:
        return self.policy.should_stop

    # ------------------------------------------------------------------------------- state
    def state_dict(self, sync: bool = True) -> dict[str, Any]:
        """What a checkpoint keeps: the window's counts (summed over ranks with ``sync``), settings, verdict, stop."""
        return dump_state(self, sync)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a saved state back; the counts are restored at :meth:`attach`."""
        self._loaded = dict(state)
        self.steps_seen = int(state.get("steps_seen", 0))
        self.first_step = int(state.get("first_step", 0))
        self.verdict = Verdict.from_dict(state["verdict"]) if state.get("verdict") else None
        self.policy.stop = StopRecord.from_dict(state["stop"]) if state.get("stop") else None

    def _restore(self, state: dict[str, Any]) -> None:
        restore_state(self, state)
