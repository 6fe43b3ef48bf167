"""What runs after each optimizer step once the screen is attached, beside the window: the collapse watch
from ``settings.watch_start`` (the warm-up's end when given, else the window's end), the trap watch from step 1
(:mod:`satmon.screen.trap`), the non-finite guard, and the stop policy that turns their breaches into a stop (or a
dry run's would-be stop). :class:`Watching` is the part of :class:`~satmon.screen.screen.Screen` that drives them; it
holds no state of its own (the screen's collaborators do), so every watch reaches the sinks the way the verdict does.

A watch that starts in the window reads only hook sets of its own (saturation and gate statistics), enabled on its
checked steps, so what the window counts (its saturation, offset and gate readings, the verdict) is what it would be
without the watch; a check in the window goes through the same stop policy as one after it, every rank at the same
step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from satmon import study
from satmon.io import tensorboard as tb
from satmon.io.sink import Sink
from satmon.io.tags import TAG
from satmon.observe.gate import GateCounter, GateHooks
from satmon.observe.saturation import SaturationHooks
from satmon.results.stop import StopReason, StopRecord
from satmon.results.verdict import Verdict
from satmon.screen.agreement import Agreement
from satmon.screen.nonfinite_guard import NonFiniteGuard
from satmon.screen.stop_policy import StopPolicy, verdict_stop_reason
from satmon.screen.trap import TrapWatch, trap_scalars
from satmon.screen.watch import CollapseWatch, LossHistory
from satmon.settings import Settings

__all__ = ["Watching"]


class Watching:
    """The watches and the stop of a :class:`~satmon.screen.screen.Screen` (a base class: the attributes below are
    the screen's)."""

    settings: Settings
    sink: Sink
    agreement: Agreement
    info: Callable[[str], None]
    warn: Callable[[str], None]
    verdict: Verdict | None
    watch: CollapseWatch | None
    trap: TrapWatch | None
    guard: NonFiniteGuard | None
    losses: LossHistory | None
    policy: StopPolicy
    layers: list[Any]
    gating: Any
    gate_hooks: Any
    hooks: Any
    notes: list[str]
    status: str
    _late: list[SaturationHooks]
    on_watch_check: Callable[[Any, CollapseWatch], None] | None

    def _make_watch(self, hooks: SaturationHooks) -> CollapseWatch:
        s = self.settings
        assert self.losses is not None
        watch = CollapseWatch(
            hooks, [], None, {}, s.watch_every_n_steps, s.collapse_threshold, s.loss_spike_z, s.patience, self.losses
        )
        self._gate_watch(watch)
        return watch

    def _gate_watch(self, watch: CollapseWatch) -> None:
        """Point ``watch`` at the DyT layers that feed gated MLPs (as the gating now says), with gate-statistics hooks
        of its own: the window's (``self.gate_hooks``, the verdict's risk table) are never read or reset by a check, so
        a watch that starts before the window's end (``settings.watch_start``) leaves the verdict as it would be
        without it. Called again when the first training forward's trace finds the gating: the saturation hooks,
        streaks and log stay, and new gate hooks take the attached / enabled state of the watch's."""
        pairings = self.gating.pairings if self.gating is not None else {}
        watch.gated = [i for i, layer in enumerate(self.layers) if layer.name in pairings]
        watch.gate_names = {k: p.mlp for k, p in pairings.items()}
        if watch.gate_hooks is not None:
            watch.gate_hooks.detach()
        watch.gate_hooks = None
        model = getattr(self, "_model", None)
        if pairings and model is not None and self.gating is not None:
            counter = GateCounter(len(pairings)).to(self.layers[0].module.alpha.device)
            watch.gate_hooks = GateHooks(model, self.gating, counter)
            if watch.hooks.attached:
                watch.gate_hooks.attach()
                watch.gate_hooks.enabled = watch.hooks.enabled

    def _verdict_policy(self, step: int) -> None:
        assert self.verdict is not None
        if self.verdict.collapse_risk and self.watch is not None:
            self.watch.count_breach(StopReason.COLLAPSE_RISK)  # the verdict is the watch streak's first breach
        reason = verdict_stop_reason(self.verdict, self.settings)
        if reason is not None and self.request_stop(reason, self.verdict.reason, step):
            return
        self._start_watch()

    def _start_watch(self) -> None:
        if self.watch is not None:
            if not self.watch.hooks.attached:  # started in the window already (settings.watch_start): it goes on
                self.watch.start()
            if self.verdict is not None:  # without one, the status says why there is none
                self.status = "watching"

    def _select_in_window(self, step: int) -> None:
        """Before step ``step``'s forwards while the window counts: a collapse watch that starts in the window
        (``settings.watch_start``) runs beside it, attached from its first step (disabled: under ``torch.compile`` the
        hooks' layout then never changes in the window, and a disabled hook returns at once) and choosing its steps
        from ``watch_start`` on as after the window (``step % watch_every_n_steps == 0``; flags only, no host sync). Its
        hook sets are its own, so the window's counts, offset and gate readings are what they would be without it."""
        s = self.settings
        if self.watch is None or s.watch_start >= s.window:
            return
        self._start_watch()
        if step >= s.watch_start:
            self.watch.select(step)

    def _watch_check(self, step: int) -> None:
        assert self.watch is not None
        reading = self.watch.check(step, self.agreement.max)
        if self.on_watch_check is not None:
            self.on_watch_check(reading, self.watch)
        tb.log_scalars(
            self.sink,
            tb.watch_scalars(
                reading.nonfinite, reading.gated_saturation, reading.gate_stats, reading.loss_z, reading.found
            ),
            step,
        )
        for reason, message in reading.due:
            if reason is StopReason.COLLAPSE_RISK and self.watch.flag_step is None:
                self._say_collapse_flag(step, message)
            if (self.stop is None or self.stop.dry_run) and self.request_stop(reason, message, step):
                return

    def _say_collapse_flag(self, step: int, message: str) -> None:
        """Say the collapse watch's first flag of the run where the verdict goes (console, the text
        ``satmon/collapse``, a note on the card), whatever ``abort_on`` is, with what changed a flagged run's outcome
        in satmon's collapse grid (``satmon.study.COLLAPSE_REMEDY``) unless the verdict's collapse risk said it."""
        assert self.watch is not None
        self.watch.flag_step = step
        note = f"the collapse watch flagged step {step}: {message}"
        if self.verdict is None or not self.verdict.collapse_risk:
            note += f"; what changed it: {study.COLLAPSE_REMEDY} (docs/science/abort_policy.md)"
        self._say(TAG.collapse_text, f"{note}.", f"satmon: {note}.", step)

    def _trap_check(self, step: int) -> None:
        """Read the trap (every rank at the same step), log it from step 1, and say it where the verdict goes when
        the run is named trapped (console, text, the card's notes) or leaves the trap."""
        assert self.trap is not None
        reading, event = self.trap.check(step, self.agreement.max)
        tb.log_scalars(self.sink, trap_scalars(reading), step)
        if event is None:
            return
        line = (
            reading.line()
            if event == "trapped"
            else (f"satmon: the run left the trap at step {step}: {reading.status()}.")
        )
        self._say(TAG.trap_text, reading.markdown() if event == "trapped" else line, line, step)

    def _say(self, tag: str, text: str, line: str, step: int) -> None:
        """Say ``line`` where the verdict goes: ``text`` as the text ``tag`` at ``step``, ``line`` on the console,
        and ``line`` (without its ``satmon: ``) as a note on the card, which says it from now on when the verdict came
        before."""
        tb.log_text(self.sink, tag, text, step)
        self.info(line)
        note = line.removeprefix("satmon: ")
        if self.verdict is None:
            self.notes.append(note)
        else:
            self.verdict = replace(self.verdict, notes=(*self.verdict.notes, note))

    def _guard_step(self, step: int, loss: Any) -> None:
        assert self.guard is not None
        if self.hooks is not None and self.hooks.attached:
            self.hooks.flush()
            nonfinite, alphas = self.hooks.counter.nonfinite.sum(), self.hooks.local_alphas()
            for late in self._late:  # layers that appeared during the window are guarded too
                late.flush()
                nonfinite = nonfinite + late.counter.nonfinite.sum().to(nonfinite.device)
                alphas = torch.cat([alphas, late.local_alphas().to(alphas.device)])
            self.guard.push(nonfinite, alphas, loss, self.agreement.max)
        else:
            self.guard.push(None, None, loss, self.agreement.max)
        seen = self.guard.poll()
        if seen:
            self.request_stop(
                StopReason.NONFINITE,
                f"non-finite DyT input(s), alpha(s) or training loss on some rank ({seen} so far, all ranks)",
                step,
            )

    # ------------------------------------------------------------------------------- stopping
    def request_stop(self, reason: StopReason, message: str, step: int) -> bool:
        """Ask the abort policy, with every rank (a collective); log and act on what it decides.

        A stop (or a dry run's would-be stop) is written to the sink (``satmon/stop``: the line as text,
        and 1.0) and given as a warning; ``abort_mode="raise"`` then raises :class:`~satmon.SatmonAbort`.

        Returns:
            True when training must stop now (on every rank).
        """
        decision = self.policy.request(reason, message, step, self.agreement)
        if decision is not None:
            tb.log_stop(self.sink, decision.record)
            self.warn(decision.record.text().replace("**", ""))
            if decision.action == "raise":
                raise decision.error()
        return self.should_stop

    @property
    def stop(self) -> StopRecord | None:
        """Why satmon stopped (or, in a dry run, would have stopped) the run."""
        return self.policy.stop

    @property
    def should_stop(self) -> bool:
        return self.policy.should_stop
