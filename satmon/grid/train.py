"""One arm of a cell: the grid's training loop (the regime study's ``train.py`` protocol),
screened by ``satmon.Screen``.

Moved from ``examples/regime_grid.py`` (0.4's faithful grid) and made recipe-generic: the model, the batches,
the held-out split and the loss come from the recipe (:mod:`satmon.grid.recipe`); the optimizer, the schedule,
the window and the cadence of every reading from :class:`~satmon.grid.config.GridSettings`, the same for every
cell. Statements run in the faithful script's order, so its cells come out to the last digit.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from satmon.grid.config import GridSettings
from satmon.grid.recipe import CellData, CellSpec, Recipe, is_dyt_arm

if TYPE_CHECKING:  # imported where an arm is trained (they pull in torch)
    from torch import nn

    from satmon.screen.screen import Screen

__all__ = ["WindowSeries", "alphas", "late_start", "lr_factor", "optimizer", "train_arm", "val_loss"]


def lr_factor(settings: GridSettings, i: int) -> float:
    """The study's schedule at update ``i`` (0-based): linear warm-up, then constant.

    Example:
        >>> [lr_factor(GridSettings(steps=8, window=4, warmup=3), i) for i in range(5)]
        [0.25, 0.5, 0.75, 1.0, 1.0]
    """
    return (i + 1) / (settings.warmup + 1) if i < settings.warmup else 1.0


def optimizer(settings: GridSettings, model: nn.Module):
    """AdamW, decay on matrices only, the study's warm-up then a constant rate (see :class:`GridSettings`)."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=tuple(settings.betas),
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda i: lr_factor(settings, i))


def val_loss(recipe: Recipe, model: nn.Module, x: Any, y: Any, batch: int = 128) -> float:
    """Mean held-out loss over every held-out row (eval mode, no grad), in batches of ``batch``."""
    import torch

    was = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            total += float(recipe.loss(model, x[i : i + batch], y[i : i + batch])) * x[i : i + batch].shape[0]
    model.train(was)
    return total / x.shape[0]


def alphas(model: nn.Module) -> dict[str, float]:
    """Each DyT layer's ``max |alpha|``."""
    from satmon.model.map import find_dyt_layers

    return {l.name: float(l.module.alpha.detach().abs().max()) for l in find_dyt_layers(model)}


@dataclass
class WindowSeries:
    """The window's running counts read from the screen every ``series_every`` steps (and at the late
    segment's start), turned into per-segment fractions."""

    names: list[str] = field(default_factory=list)
    marks: list[tuple[int, list[int], list[int], dict[str, float]]] = field(default_factory=list)

    def read(self, step: int, screen: Screen, model: nn.Module) -> None:
        r = screen.hooks.read(sync=False)  # cumulative (saturated, total) per layer since step 1; one host read
        self.names = list(screen.layer_names)
        self.marks.append((step, [int(s) for s in r.saturated], [int(t) for t in r.total], alphas(model)))

    def at(self, step: int) -> tuple[list[int], list[int]]:
        for s, sat, tot, _ in self.marks:
            if s == step:
                return sat, tot
        raise KeyError(step)

    def series(self, every: int) -> list[dict[str, Any]]:
        out, prev = [], (0, [0] * len(self.names), [0] * len(self.names))
        for step, sat, tot, alpha in self.marks:
            if step % every:
                continue
            ds = [a - b for a, b in zip(sat, prev[1])]
            dt = [a - b for a, b in zip(tot, prev[2])]
            out.append(
                {
                    "step": step,
                    "saturation": sum(ds) / sum(dt) if sum(dt) else math.nan,
                    "per_layer": {n: s / t if t else math.nan for n, s, t in zip(self.names, ds, dt)},
                    "cumulative": sum(sat) / sum(tot) if sum(tot) else math.nan,
                    "alpha": alpha,
                }
            )
            prev = (step, sat, tot)
        return out


def late_start(settings: GridSettings) -> int:
    """The late segment is the window's last fifth: steps ``late_start + 1 .. window``."""
    return settings.window - max(1, settings.window // 5)


def _digest(x: Any, crc: int) -> int:
    """``crc`` updated with the bytes of the batch's inputs (the two arms' batch streams are compared by it)."""
    return zlib.crc32(x.detach().cpu().contiguous().numpy().tobytes(), crc)


def _start_state(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def check_same_start(
    ln_start: dict[str, Any], dyt_model: Any, recipe: Recipe, arm: str = "dyt", reference: str = "layernorm"
) -> None:
    """Every arm must start from the reference arm's weights wherever they share a tensor (same name and shape)."""
    import torch

    dyt = dyt_model.state_dict()
    shared = [k for k in ln_start if k in dyt and tuple(dyt[k].shape) == tuple(ln_start[k].shape)]
    differ = [k for k in shared if not torch.equal(ln_start[k].to(dyt[k].device), dyt[k])]
    if differ or not shared:
        raise ValueError(
            f"Expected the recipe {recipe.name!r} to build the arm {arm!r} from the reference arm {reference!r}'s "
            "initial weights where they share a tensor, got "
            + (f"different values in {', '.join(differ[:4])}" if differ else "no tensor in common")
            + ": seed every random draw from spec.seed inside model(spec, norm) (torch.manual_seed(spec.seed) "
            "before building), and convert LayerNorm to DyT after the weights are drawn."
        )


def train_arm(
    settings: GridSettings,
    recipe: Recipe,
    spec: CellSpec,
    data: CellData,
    norm: str,
    on_step: Callable[[int, Any], None] | None = None,
    progress: Callable[[int], None] | None = None,
    same_start: dict[str, Any] | None = None,
    reference: str = "layernorm",
) -> dict[str, Any]:
    """Train one arm of a cell; the DyT arm is screened by ``satmon.Screen`` over its first ``settings.window`` steps.

    Args:
        on_step: called as ``on_step(step, model)`` after each optimizer step (tests).
        progress: called with the step every ``eval_every`` steps (the grid's progress file).
        same_start: the reference arm's initial state: this arm must start from the same weights where they share a
            tensor; ``reference`` names that arm.

    A DyT arm (:func:`~satmon.grid.recipe.is_dyt_arm`) is screened with the shipped watch settings after the window
    (``abort_on="never"``: a flag never stops the run); every watch check is recorded.

    Returns:
        ``model`` (the final weights), ``start`` (its initial state), ``val_loss`` (final step),
        ``val_curve`` [(step, loss)], ``train_curve`` [(step, mean loss of the last ``series_every`` steps)],
        ``batches_crc`` (a digest of every batch's inputs), ``diverged_at`` (the first step whose training loss was
        not finite, else the first held-out check whose loss was not; ``None``: it never diverged), and for DyT the
        window's ``verdict``, its ``series``
        the ``alpha_curve`` [(step, {layer: alpha})] and the ``watch`` (the watch's checks, :func:`watch_record`).
    """
    import torch

    from satmon.model.map import find_dyt_layers
    from satmon.screen.screen import Screen

    model = recipe.model(spec, norm)
    if model is None or not hasattr(model, "parameters"):
        raise ValueError(
            f"Expected the recipe {recipe.name!r}'s model(spec, {norm!r}) to return a torch.nn.Module, got "
            f"{type(model).__name__}."
        )
    has_dyt, dyt_arm = bool(find_dyt_layers(model)), is_dyt_arm(norm)
    if has_dyt != dyt_arm:
        raise ValueError(
            f"Expected the recipe {recipe.name!r}'s {norm!r} arm to hold "
            f"{'DyT layers' if dyt_arm else 'no DyT layer'}, got "
            f"{'some' if has_dyt else 'none'}: build norm='dyt' with satmon.convert_to_dyt(model) "
            "(rmsnorm=True for RMSNorm models) and norm='layernorm' without it."
        )
    model = model.to(settings.device)
    if same_start is not None:
        check_same_start(same_start, model, recipe, norm, reference)
    start = _start_state(model) if same_start is None else None
    opt, sched = optimizer(settings, model)
    batches = iter(data.train())
    vx, vy = data.val_inputs.to(settings.device), data.val_targets.to(settings.device)
    screen: Screen | None = None
    series, watch = WindowSeries(), WatchLog()
    if dyt_arm:
        # the verdict and the collapse watch with the shipped defaults; abort_on="never" (the default): no stop, no card
        screen = Screen(window=settings.window, verbose=False, offset_every=settings.offset_every)
        screen.attach(model, example_input=data.example_input.to(settings.device))
        screen.on_watch_check = watch.add
    marks = {s for s in range(settings.series_every, settings.window + 1, settings.series_every)} | {
        late_start(settings),
        settings.window,
    }
    curve: list[tuple[int, float]] = []
    train_curve: list[tuple[int, float]] = []
    alpha_curve: list[tuple[int, dict[str, float]]] = []
    running = torch.zeros((), dtype=torch.float64, device=settings.device)
    first_bad = torch.zeros((), dtype=torch.long, device=settings.device)  # the first non-finite loss's step (0: none)
    val_bad: int | None = None  # the first held-out check whose loss was not finite
    n_running, crc = 0, 0
    model.train()
    for step in range(1, settings.steps + 1):
        try:
            x, y = next(batches)  # (B, T), (B, T)
        except StopIteration:
            raise ValueError(
                f"Expected the recipe {recipe.name!r}'s data.train() to yield {settings.steps} batches, got "
                f"{step - 1}: make it an endless stream (draw random windows of the budget)."
            ) from None
        crc = _digest(x, crc)
        x, y = x.to(settings.device), y.to(settings.device)
        loss = recipe.loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        sched.step()
        running += loss.detach().double()
        first_bad.masked_fill_((first_bad == 0) & ~torch.isfinite(loss.detach()), step)  # on the device: no host sync
        n_running += 1
        if screen is not None:
            if step in marks and screen.verdict is None:
                series.read(step, screen, model)  # before step(): at the window's last step the screen concludes
            screen.step(loss.detach())
        if on_step is not None:
            on_step(step, model)
        if step % settings.series_every == 0 or step == settings.steps:
            train_curve.append((step, float(running) / n_running))
            running.zero_()
            n_running = 0
        if step % settings.eval_every == 0 or step == settings.steps or step == settings.window:
            if screen is not None:
                with screen.paused():  # validation forwards are not training forwards
                    curve.append((step, val_loss(recipe, model, vx, vy, data.val_batch)))
                alpha_curve.append((step, alphas(model)))
            else:
                curve.append((step, val_loss(recipe, model, vx, vy, data.val_batch)))
            if val_bad is None and not math.isfinite(curve[-1][1]):
                val_bad = step
            if progress is not None:
                progress(step)
    bad = int(first_bad)  # one host read, after the loop
    out: dict[str, Any] = {
        "model": model,
        "start": start,
        "val_loss": curve[-1][1],
        "val_curve": curve,
        "train_curve": train_curve,
        "batches_crc": crc,
        "diverged_at": bad if bad else val_bad,
    }
    if screen is not None:
        screen.finish()
        screen.detach()
        out.update(
            verdict=screen.verdict,
            series=series,
            alpha_curve=alpha_curve,
            watch=watch.record(screen.settings, screen.verdict, settings.window, screen.trap),
        )
    return out


@dataclass
class WatchLog:
    """Every check of the screen's collapse watch, as :attr:`satmon.Screen.on_watch_check` delivers it (the watch
    itself is unchanged: the grid only reads its readings and streaks)."""

    checks: list[dict[str, Any]] = field(default_factory=list)

    def add(self, r: Any, watch: Any) -> None:
        """One check: its readings, whether a collapse-risk breach was due, and the collapse streak after it."""
        from satmon.screen.stop_policy import StopReason

        stats = {k: {n: _finite(v) for n, v in st.items()} for k, st in r.gate_stats.items()}  # NaN: no data -> None
        flat = [st["flat_fraction"] for st in stats.values() if st.get("flat_fraction") is not None]
        self.checks.append(
            {
                "step": r.step,
                "gated_saturation": r.gated_saturation,
                "flat_fraction": sum(flat) / len(flat) if flat else None,
                "gate_stats": stats,
                "mean_abs_hidden": _mean_stat(stats, "mean_abs_hidden"),
                "loss_z": _finite(r.loss_z),
                "nonfinite": r.nonfinite,
                "found": {k.value: bool(v) for k, v in r.found.items()},
                "flagged": any(reason is StopReason.COLLAPSE_RISK for reason, _ in r.due),
                "patience_count": int(watch.streak.get(StopReason.COLLAPSE_RISK, 0)),
            }
        )

    def record(self, s: Any, verdict: Any, window: int, trap: Any = None) -> dict[str, Any]:
        """The watch's record: its settings (``start``: the step its checks start from, ``Settings.watch_start``), every
        check, the first flag's step (``None``: never), whether the window's verdict said collapse risk, and
        ``would_stop_at``: the step ``abort_on="collapse"`` would have stopped the run (the first flag or, on a
        collapse-risk verdict, the window's end, whichever comes first; ``None``: never). With the
        screen's trap watch (``trap``, a :class:`~satmon.screen.trap.TrapWatch`), ``trap`` holds its settings, every
        check (:meth:`~satmon.results.trap.TrapReading.to_dict`) and ``first_trapped_step`` (``None``: never named)."""
        first = next((c["step"] for c in self.checks if c["flagged"]), None)
        risk = bool(getattr(verdict, "collapse_risk", False)) if verdict is not None else False
        out = {
            "every_n_steps": s.watch_every_n_steps,
            "watch_from": s.watch_from,
            "start": s.watch_start,  # where the checks start (watch_from, else the warm-up's end, else the window's)
            "collapse_threshold": s.collapse_threshold,
            "patience": s.patience,
            "loss_spike_z": s.loss_spike_z,
            "checks": self.checks,
            "first_flag_step": first,
            "window_collapse_risk": risk,
            # a watch that starts in the window (watch_from) may flag before its end
            "would_stop_at": min((x for x in (first, window if risk else None) if x is not None), default=None),
        }
        if trap is not None:
            out["trap"] = {
                "every_n_steps": trap.every,
                "patience": trap.patience,
                "floor": trap.floor,
                "checks": list(trap.log),
                "first_trapped_step": next((c["step"] for c in trap.log if c["trapped"]), None),
            }
        return out


def _finite(v: Any) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _mean_stat(stats: Any, name: str) -> float | None:
    vals = [float(v[name]) for v in stats.values() if v.get(name) is not None]
    return sum(vals) / len(vals) if vals else None
