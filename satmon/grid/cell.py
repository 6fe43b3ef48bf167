"""One cell, measured: both arms of a (size, budget, seed) from the same initial weights on the same batches, and
its record (plain JSON values). Also the cell's name and its content key.

The record keeps the faithful grid's fields (``examples/regime_grid.py`` 0.4: ``satmon calibrate --cells`` reads
``group``, ``delta`` and every numeric field as a reading) and adds the best checkpoint's outcome
(``delta_best``, ``helps_best``: DyT's best held-out loss against LayerNorm's best), the recipe and the key.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from satmon.grid.config import Budget, GridSettings
from satmon.grid.recipe import CellSpec, Recipe

__all__ = ["cell_key", "cell_name", "code_version", "environment", "grid_key", "measure_cell"]


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def grid_key(
    identity: Mapping[str, Any], settings: GridSettings, options: Mapping[str, Any], arms: tuple[str, ...] | None = None
) -> str:
    """The key every cell of one configuration shares: the recipe's identity, every shared setting, the options.

    Example:
        >>> a = grid_key({"name": "r"}, GridSettings(), {"x": 1})
        >>> b = grid_key({"name": "r"}, GridSettings(lr=1e-3), {"x": 1})
        >>> a == grid_key({"name": "r"}, GridSettings(), {"x": 1}), a == b
        (True, False)
    """
    from satmon.grid.recipe import NORMS

    body = {"recipe": dict(identity), "settings": settings.shared(), "options": dict(options)}
    if arms is not None and tuple(arms) != NORMS:  # the default arms keep the keys made before arms existed
        body["arms"] = list(arms)
    return _digest(body)


def cell_key(key: str, size: str, unique_tokens: int, seed: int) -> str:
    """A cell's content key: the configuration's key and the cell's axes (12 hex digits in file names).

    Example:
        >>> len(cell_key("abc", "d64L2", 31220, 0))
        12
    """
    return _digest({"grid": key, "size": size, "unique_tokens": unique_tokens, "seed": seed})[:12]


def cell_name(size: str, unique_tokens: int, seed: int) -> str:
    """The cell's readable name (the faithful grid's): ``<size>_t<unique tokens>_s<seed>``.

    Example:
        >>> cell_name("d64L2", 31220, 0)
        'd64L2_t31220_s0'
    """
    return f"{size}_t{unique_tokens}_s{seed}"


def make_spec(
    recipe: Recipe, settings: GridSettings, options: Mapping[str, Any], size: str, budget: Budget, seed: int
) -> CellSpec:
    """The :class:`CellSpec` the recipe sees for one cell."""
    processed = settings.steps * recipe.step_tokens(options)
    return CellSpec(
        size=size,
        budget=budget.text,
        unique_tokens=budget.resolve(processed),
        seed=seed,
        steps=settings.steps,
        processed_tokens=processed,
        options=dict(options),
    )


def measure_cell(
    recipe: Recipe,
    settings: GridSettings,
    spec: CellSpec,
    threads: int = 1,
    progress: Callable[[str, int], None] | None = None,
    extra: Mapping[str, Any] | None = None,
    arms: tuple[str, ...] | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """Train every arm of one cell (the reference arm first) and return its record (plain JSON values).

    The top-level fields keep the two-arm grid's names: ``*_layernorm`` is the reference arm (``reference_arm``,
    ``"layernorm"`` by default) and ``*_dyt`` the compared arm (``compared_arm``: ``"dyt"`` where the cell has
    it, else its first DyT arm); ``arms`` holds every arm's own record (curves, best loss, alphas, parameter
    counts, and for a DyT arm its window verdict and every check of the collapse watch).

    Args:
        recipe: the recipe (:class:`~satmon.grid.recipe.Recipe`).
        settings: the shared settings.
        spec: the cell (:func:`make_spec`).
        threads: torch's intra-op threads (one per cell by default: cells run side by side).
        progress: ``progress(arm, step)`` every ``eval_every`` steps of each arm.
        extra: fields added to the record (the key, the recipe's identity).
        arms: the arms to train (default the recipe's); the first is the reference.
        jobs: how many cells ran side by side (recorded in ``environment``, as the grid's own record has it).

    Raises:
        ValueError: the recipe broke its contract (arms from different weights, different batches, a DyT arm
            without DyT layers, too few batches); the message says which and how to fix it.
    """
    import torch

    from satmon.grid.readings import final_readings, window_readings
    from satmon.grid.train import train_arm

    torch.set_num_threads(threads)
    t0, c0 = time.perf_counter(), time.process_time()
    data = recipe.data(spec)
    from satmon.grid.recipe import is_dyt_arm

    names = tuple(arms) if arms is not None else tuple(recipe.arms)
    ref_name = names[0]
    dyt_names = [a for a in names if is_dyt_arm(a)]
    if not dyt_names:
        raise ValueError(f"Expected at least one DyT arm ('dyt' or 'dyt-...') among the arms, got {', '.join(names)}.")
    cmp_name = "dyt" if "dyt" in names else dyt_names[0]
    trained: dict[str, dict[str, Any]] = {}
    for norm in names:
        trained[norm] = train_arm(
            settings,
            recipe,
            spec,
            data,
            norm,
            progress=(lambda s, n=norm: progress(n, s)) if progress else None,
            same_start=trained[ref_name]["start"] if norm != ref_name else None,
            reference=ref_name,
        )
    ln, dyt = trained[ref_name], trained[cmp_name]
    for norm in names[1:]:
        if trained[norm]["batches_crc"] != ln["batches_crc"]:
            raise ValueError(
                f"Expected the recipe {recipe.name!r}'s data.train() to yield the same batches to every arm, "
                f"got different ones ({norm!r} and {ref_name!r}): return a fresh iterator seeded from spec.seed "
                "on each call (a new torch.Generator().manual_seed(spec.seed) inside train())."
            )
    uni = data.unigram_loss
    params, params_total = recipe.params(dyt["model"])
    nbytes = data.unique_tokens
    processed = spec.processed_tokens
    cell: dict[str, Any] = {
        "name": cell_name(spec.size, spec.unique_tokens, spec.seed),
        "group": spec.size,
        "seed": spec.seed,
        **(recipe_fields(recipe, spec)),
        "params": params,
        "params_total": params_total,
        "train_tokens": nbytes,
        "budget": spec.budget,
        "epochs": processed / nbytes,
        "tokens_per_param": nbytes / params,
        "log_params_per_token": math.log10(params / nbytes),
        "processed_tokens_per_param": processed / params,
        "steps": settings.steps,
        "window": settings.window,
        "warmup": settings.warmup,
        "lr": settings.lr,
        "val_loss_dyt": dyt["val_loss"],
        "val_loss_layernorm": ln["val_loss"],
        "unigram_loss": uni,
        "delta": (dyt["val_loss"] - ln["val_loss"]) / ln["val_loss"],
    }
    diverged = {a: trained[a]["diverged_at"] for a in names if trained[a].get("diverged_at") is not None}
    cell["helps"] = outcome_helps(cell["delta"], diverged.get(cmp_name), diverged.get(ref_name))
    # a diverged arm's loss is no level to compare: not known, never "above the unigram level"
    cell["learns_dyt"] = None if uni is None or not math.isfinite(dyt["val_loss"]) else dyt["val_loss"] < uni
    cell["learns_layernorm"] = None if uni is None or not math.isfinite(ln["val_loss"]) else ln["val_loss"] < uni
    cell.update(window_readings(settings, dyt["verdict"], dyt["series"]))
    cell.update(
        final_readings(
            settings, dyt["model"], data.probe, data.probe_heldout if data.probe_heldout is not None else _heldout(data)
        )
    )
    best_dyt, best_ln = _best(dyt["val_curve"]), _best(ln["val_curve"])
    cell.update(
        {
            "best_val_loss_dyt": best_dyt,
            "best_val_loss_layernorm": best_ln,
            "val_curve_dyt": dyt["val_curve"],
            "val_curve_layernorm": ln["val_curve"],
            "train_curve_dyt": dyt["train_curve"],
            "train_curve_layernorm": ln["train_curve"],
            "alpha_curve": dyt["alpha_curve"],
            "cpu_seconds": time.process_time() - c0,
            "wall_seconds": time.perf_counter() - t0,
            "threads": threads,
            "config": {**settings.shared(), **recipe.shared_options(spec.options)},
            "code": code_version(),
            "environment": environment(threads, jobs),
        }
    )
    cell["reference_arm"], cell["compared_arm"] = ref_name, cmp_name
    cell["missing"] = {}
    cell["arms"] = {a: arm_record(recipe, settings, trained[a], is_dyt_arm(a)) for a in names}
    both = best_dyt is not None and best_ln is not None
    cell.update(
        {
            "passes": cell["epochs"],
            "delta_best": (best_dyt - best_ln) / best_ln if both else None,
            "helps_best": best_dyt < best_ln if both else None,
            "best_step_dyt": _argmin(dyt["val_curve"]),
            "best_step_layernorm": _argmin(ln["val_curve"]),
            "batches_crc": ln["batches_crc"],
            **dict(extra or {}),
        }
    )
    cell["diverged"] = diverged
    return _diverged_reasons(missing_as_null(cell), diverged, ref_name, cmp_name)


def outcome_helps(delta: float | None, compared_diverged: int | None, reference_diverged: int | None) -> bool | None:
    """Whether DyT helped: ``delta < 0`` where both final losses are finite; where one arm diverged (its loss not
    finite) the other did better (the compared arm diverging is DyT hurting); ``None`` where both diverged.

    Example:
        >>> outcome_helps(-0.01, None, None), outcome_helps(float("nan"), 120, None), outcome_helps(None, None, 7)
        (True, False, True)
        >>> outcome_helps(None, 5, 9) is None
        True
    """
    if compared_diverged is not None or reference_diverged is not None:
        if compared_diverged is not None and reference_diverged is not None:
            return None
        return reference_diverged is not None
    return bool(delta < 0) if delta is not None and math.isfinite(delta) else None


def _diverged_reasons(cell: dict[str, Any], diverged: Mapping[str, int], ref: str, cmp: str) -> dict[str, Any]:
    """``cell`` with each missing value of a diverged arm explained as its divergence (not "too few points")."""
    if not diverged:
        return cell
    why = {a: f"the {a} arm diverged at step {n} (its loss is not finite)" for a, n in diverged.items()}
    prefixes = {a: (f"arms.{a}.",) for a in why}
    for a, suffix in ((ref, "layernorm"), (cmp, "dyt")):
        if a in why:
            kinds = ("val_loss", "val_curve", "train_curve", "best_val_loss")
            prefixes[a] += tuple(f"{kind}_{suffix}" for kind in kinds)
    missing = cell["missing"]
    for path in list(missing):
        for a, pre in prefixes.items():
            if path.startswith(pre):
                missing[path] = why[a]
    for path in ("delta", "delta_best"):
        if cell.get(path) is None:
            missing[path] = "; ".join(why.values())
    return cell


def _best(curve: list[tuple[int, float]]) -> float | None:
    """The best (lowest) finite held-out loss of a curve; ``None``: none was finite."""
    finite = [v for _, v in curve if math.isfinite(v)]
    return min(finite) if finite else None


def missing_as_null(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with every non-finite number (a reading that could not be computed, e.g. a loss trend over too few
    points) replaced by ``None`` and listed in ``record["missing"]`` by its path, with why.

    Example:
        >>> missing_as_null({"a": 1.0, "t": {"slope": float("nan")}, "missing": {}})  # doctest: +NORMALIZE_WHITESPACE
        {'a': 1.0, 't': {'slope': None}, 'missing': {'t.slope': 'not computable from this run
        (NaN: too few points or no data)'}}
    """
    missing = record.setdefault("missing", {})

    def walk(obj: Any, path: str) -> Any:
        if isinstance(obj, float) and not math.isfinite(obj):
            missing[path] = (
                "not computable from this run (NaN: too few points or no data)"
                if math.isnan(obj)
                else f"not finite ({obj})"
            )
            return None
        if isinstance(obj, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        return obj

    out = {k: walk(v, k) for k, v in record.items() if k != "missing"}
    out["missing"] = missing
    return out


def arm_record(recipe: Recipe, settings: GridSettings, arm: dict[str, Any], screened: bool) -> dict[str, Any]:
    """One arm's own record: its curves, final and best held-out loss, parameter counts, and for a DyT arm its
    window verdict, alphas and the collapse watch's checks (:class:`~satmon.grid.train.WatchLog`)."""
    from satmon.grid.readings import window_readings
    from satmon.grid.train import alphas

    params, params_total = recipe.params(arm["model"])
    out: dict[str, Any] = {
        "val_loss": arm["val_loss"],
        "best_val_loss": _best(arm["val_curve"]),
        "best_step": _argmin(arm["val_curve"]),
        "diverged_at": arm.get("diverged_at"),
        "val_curve": arm["val_curve"],
        "train_curve": arm["train_curve"],
        "params": params,
        "params_total": params_total,
    }
    if screened:
        w = window_readings(settings, arm["verdict"], arm["series"])
        out.update(
            {
                "alpha_curve": arm["alpha_curve"],
                "final_alpha": alphas(arm["model"]),
                "watch": arm["watch"],
                **{
                    k: w[k]
                    for k in (
                        "window_saturation",
                        "window_decision",
                        "window_margin",
                        "window_flags",
                        "window_late",
                        "window_per_layer",
                    )
                },
            }
        )
    return out


def recipe_fields(recipe: Recipe, spec: CellSpec) -> dict[str, Any]:
    """The recipe's own fields for a cell (``describe(spec)``, e.g. the builtin's width and depth), JSON values."""
    return dict(recipe.describe(spec)) if recipe.describe is not None else {}


def _argmin(curve: list[tuple[int, float]]) -> int | None:
    finite = [sv for sv in curve if math.isfinite(sv[1])]
    return min(finite, key=lambda sv: sv[1])[0] if finite else None


def _heldout(data: Any) -> list[Any]:
    n = max(1, len(data.probe))
    size = data.probe[0].shape[0] if data.probe else data.val_inputs.shape[0]
    return list(data.val_inputs.split(size))[:n]


def code_version() -> str:
    """The satmon commit this runs (``+dirty`` with uncommitted changes under ``satmon/``), or its version."""
    from satmon._version import __version__

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return f"satmon {__version__} (not a git checkout)"
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "satmon", "examples"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"satmon {__version__} (git unavailable)"
    return head + ("+dirty" if dirty else "")


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(threads: int, jobs: int) -> dict[str, Any]:
    """What a reader needs to know where the numbers came from."""
    import torch

    from satmon._version import __version__

    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "threads": threads,
        "jobs": jobs,
        "satmon": __version__,
        "satmon_commit": code_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
