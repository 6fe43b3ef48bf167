"""``satmon.grid.run``: a grid of cells as jobs, resumable, one grid per output folder at a time.

The output folder ``out`` holds::

    cells/<name>.<key>.json          a complete cell (written atomically: the only truth of "done")
    cells/<name>.<key>.attempt.json  a job started on it (pid, host, job id, log); removed when it completes
    cells/<name>.<key>.failed.json   the error a job caught
    jobs/                            the executor's folder (submitit's pickles and logs, or plain logs)
    grid.json                        the cells of this configuration, the missing and failed ones and why,
                                     the environment, the analysis (``satmon calibrate --cells`` reads it)
    phase_grid.csv, report.md        the cells for ``satmon report --plot --cells``; the analysis as markdown

``key`` is a content key (:func:`satmon.grid.cell.cell_key`): the recipe's identity and source, every shared
setting, the options and the cell's axes. A changed configuration makes new keys, so its cells are new cells;
old ones stay on disk, never read into this grid. The whole folder is held by :func:`satmon.io.lock.exclusive`
while a grid runs: a second grid into the same folder stops at once, naming the first.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from satmon.grid.cell import cell_key, cell_name, grid_key, make_spec
from satmon.grid.config import Budget, GridPlan, GridSettings, parse_budgets, parse_seeds, parse_sizes
from satmon.grid.recipe import Recipe, load_recipe, recipe_identity
from satmon.grid.store import check_file_names, written_beneath
from satmon.grid.vary import parse_vary, vary_configs, vary_suffix

__all__ = ["CellStatus", "GridInterrupted", "GridResult", "run"]

FORMAT = "satmon-grid/1"


@dataclass(frozen=True)
class CellStatus:
    """Where one cell stands: ``"done"``, ``"failed"`` (a caught error), ``"died"`` (its job ended without a result:
    killed, out of memory, preempted, node lost), ``"missing"`` (never run, or interrupted), with why and its log."""

    name: str
    key: str
    state: str
    why: str = ""
    log: str | None = None


@dataclass(frozen=True)
class GridResult:
    """What :func:`run` returns.

    Attributes:
        out: the output folder; ``json_path`` the grid JSON.
        cells: the complete cells' records, in grid order (smallest model first).
        status: every cell's :class:`CellStatus`.
        analysis: the plan's analysis of the complete cells (:func:`satmon.grid.analysis.analyze`), ``{}`` if none.
        answer: the text printed at the end (DyT's effect, the window's test, the forecast's record).
    """

    out: Path
    json_path: Path
    cells: list[dict[str, Any]]
    status: list[CellStatus]
    analysis: dict[str, Any] = field(default_factory=dict)
    answer: str = ""

    @property
    def complete(self) -> bool:
        return all(s.state == "done" for s in self.status)


class GridInterrupted(KeyboardInterrupt):
    """Ctrl-C during a grid: ``result`` holds what was finished (every finished cell is on disk)."""

    def __init__(self, result: GridResult) -> None:
        super().__init__("interrupted")
        self.result = result


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _complete(path: Path, key: str) -> dict[str, Any] | None:
    cell = _read_json(path)
    return cell if isinstance(cell, dict) and cell.get("key") == key and "delta" in cell else None


def _log_phrase(log: Any) -> str:
    """A job's log as a message names it: its path, or that there is none and why."""
    if isinstance(log, str) and log:
        return f"log {log}" if os.path.isfile(log) else f"its log {log} is gone"
    return "no log: the job could not name one (it started outside submitit and the plain-process executor)"


def _alive(pid: Any, host: Any) -> bool:
    import os

    if host != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run(
    recipe: str | Recipe = "builtin",
    sizes: str | Sequence[str] | None = None,
    budgets: str | Sequence[str | Budget] | None = None,
    seeds: str | Sequence[int] | None = None,
    *,
    out: str | Path = "satmon_grid",
    settings: GridSettings | Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    preset: str | None = None,
    executor: str = "local",
    jobs: int = 2,
    time_min: int = 24 * 60,
    slurm: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    permutations: int = 10_000,
    every: float | None = None,
    say: Callable[[str], None] | None = None,
    spec: str | None = None,
    arms: str | Sequence[str] | None = None,
    vary: Mapping[str, Sequence[Any] | str] | Sequence[str] | None = None,
) -> GridResult:
    """Run a LayerNorm-vs-DyT grid on ``recipe``: every cell without a complete result, as jobs; then the answer.

    Args:
        recipe: ``"builtin"`` (satmon's faithful grid), ``"MODULE:ATTR"`` / ``"path/file.py:ATTR"`` naming a
            :class:`~satmon.grid.recipe.Recipe`, or a Recipe object (``spec`` then says how a job imports it).
        sizes, budgets, seeds: the axes (``"d64L2,d96L3"``, ``"164ep,1.4ep"``, ``"0,1"``); ``None``: the preset's.
        out: the output folder (one grid at a time: a second one into it raises
            :class:`~satmon.io.lock.OutputBusy`).
        settings: :class:`~satmon.grid.config.GridSettings` or a mapping of its fields over the preset's.
        options: the recipe's options over its defaults (and the preset's).
        arms: the arms to run (``"rmsnorm,dyt,dyt-gelu"``), among the recipe's ``arms`` (default: all of them);
            the recipe's first arm, the reference, always runs. Arms other than the default two enter the key.
        vary: extra axes, ``{"alpha_init": "0.5,1,2", "lr": [1e-3, 3e-3]}`` or ``["alpha_init=0.5,1,2", ...]``
            (``--vary``): recipe options or grid settings (every field of GridSettings but ``steps`` and
            ``device``), crossed with sizes x budgets x seeds; values typed as their default's; the varied values
            enter each cell's key, name and record (``vary``).
        preset: one of the recipe's presets (the builtin's ``"full"``, ``"quick"``, ``"smoke"``, ``"grid2"``).
        executor: ``"local"`` (``jobs`` at once, one thread each; submitit's LocalExecutor, or plain processes
            without submitit) or ``"slurm"`` (one submitit job array; ``slurm``: its parameters, from
            :func:`~satmon.grid.jobs.slurm_parameters`).
        time_min: a job's time limit in minutes (SLURM's ``--time``; submitit's local timeout).
        dry_run: with ``"slurm"``: write ``jobs/submission.sh`` (the sbatch file submitit would submit) and the
            tasks, submit nothing.
        permutations: shuffles of the plan's permutation test.
        every: seconds between progress lines (default 30 on a terminal, 120 otherwise).
        say: where progress and the answer go (default: stderr lines prefixed ``satmon grid:``).

    Returns:
        The :class:`GridResult` (also written as ``out/grid.json``).

    Raises:
        ValueError: a setting, an axis or an option the recipe cannot run, before any job starts.
        GridInterrupted: Ctrl-C; every finished cell is kept, ``grid.json`` lists the rest, a rerun resumes.

    Example:
        >>> import tempfile
        >>> plan = run("builtin", preset="smoke", out=tempfile.mkdtemp(), executor="slurm", dry_run=True,
        ...            say=print)  # the sbatch file only, no cluster needed  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
        4 cells (0 complete), 4 to run, 8 steps each (window 4), recipe satmon-faithful-gpt -> ...
        dry run: 4 cells as one SLURM array; sbatch file .../jobs/submission.sh,
        tasks .../jobs/tasks.json; nothing submitted
        >>> [s.state for s in plan.status]
        ['missing', 'missing', 'missing', 'missing']
        >>> r = run("builtin", preset="smoke", out=tempfile.mkdtemp(), jobs=2)  # doctest: +SKIP
        >>> r.complete, r.answer.splitlines()[0]  # doctest: +SKIP
        (True, 'DyT vs LayerNorm on satmon-faithful-gpt: 4 cells')
    """
    from satmon.io.atomic import check_output_dir
    from satmon.io.lock import exclusive

    if say is None:

        def say(line: str) -> None:
            print(f"satmon grid: {line}", file=sys.stderr, flush=True)

    if isinstance(recipe, Recipe):
        obj, where = recipe, spec or ""
        if not where:
            raise ValueError(
                "Expected spec='MODULE:ATTR' with a Recipe object (jobs import the recipe by name), got none."
            )
    else:
        obj, where = load_recipe(recipe)
    plan, settings_, opts = _resolve(obj, preset, sizes, budgets, seeds, settings, options)
    arms_ = obj.pick_arms(arms)
    processed = settings_.steps * obj.step_tokens(opts)
    plan.check(processed)
    if obj.check is not None:  # the axes first, in argument order (--sizes before --steps and --window)
        for size, budget, seed in plan.cells():
            obj.check(make_spec(obj, settings_, opts, size, budget, seed))
    settings_.check()
    configs = vary_configs(obj, settings_, opts, parse_vary(vary))
    for _, st_c, opts_c in configs:
        processed_c = st_c.steps * obj.step_tokens(opts_c)
        plan.check(processed_c)
        if obj.check is not None:
            for size, budget, seed in plan.cells():
                obj.check(make_spec(obj, st_c, opts_c, size, budget, seed))
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"Expected --jobs >= 1, got {jobs!r}.")
    identity = recipe_identity(obj, where)
    from satmon.grid.config import options_json

    # every option, even those a record leaves out (but a late option at its default), and the arms
    gkey = grid_key(identity, settings_, options_json(obj.keyed_options(opts)), arms_)
    keyed = [
        (
            v,
            st_c,
            o_c,
            grid_key(identity, st_c, options_json(obj.keyed_options(o_c)), arms_),
            st_c.steps * obj.step_tokens(o_c),
        )
        for v, st_c, o_c in configs
    ]
    check_file_names(Path(out), _entries(Path(out), plan, keyed))  # a cell file name no file system takes, named
    # room beneath --out for every cell's files (satmon.paths.check_room), before anything is made
    out = check_output_dir(
        Path(out),
        "--out",
        written_beneath(Path(out), plan, keyed),
        names="--vary value (a cell's files are named by the values it varies)",
    ) or Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive(out, "the grid folder --out", folder=True) as held:
        if held.stale:
            say(f"the last grid into {out} was stopped without finishing ({held.note()}); resuming its folder")
        return _run_locked(
            obj,
            where,
            identity,
            plan,
            settings_,
            opts,
            gkey,
            out,
            executor,
            jobs,
            time_min,
            slurm or {},
            dry_run,
            permutations,
            every,
            say,
            processed,
            arms_,
            keyed,
        )


def _entries(
    out: Path, plan: GridPlan, configs: list[tuple[dict[str, Any], GridSettings, dict[str, Any], str, int]]
) -> list[dict[str, Any]]:
    """Every cell of the grid: its name, key, axes and the files it is written to (``configs``: the ``--vary``
    configurations, each with its settings, options, key and processed tokens)."""
    cells_dir = out.absolute() / "cells"  # absolute: a job runs in the job folder, not here
    entries = []
    for vary, st_c, opts_c, gkey_c, processed_c in configs:
        for size, budget, seed in plan.cells():
            tokens = budget.resolve(processed_c)
            key = cell_key(gkey_c, size, tokens, seed)
            name = cell_name(size, tokens, seed) + vary_suffix(vary)
            stem = cells_dir / f"{name}.{key}"
            e = {
                "name": name,
                "key": key,
                "size": size,
                "budget": budget.text,
                "seed": seed,
                "cell": str(stem) + ".json",
                "attempt": str(stem) + ".attempt.json",
                "failed": str(stem) + ".failed.json",
                "progress": str(cells_dir / f".{name}.{key}.progress"),
            }
            if vary:  # the cell's own settings and options (a task's own fields override the grid's)
                e.update(settings=st_c.shared() | {"device": st_c.device}, options=opts_c, vary=vary, grid_key=gkey_c)
            entries.append(e)
    return entries


def _resolve(
    recipe: Recipe,
    preset: str | None,
    sizes: Any,
    budgets: Any,
    seeds: Any,
    settings: GridSettings | Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
) -> tuple[GridPlan, GridSettings, dict[str, Any]]:
    base: Mapping[str, Any] = {}
    if preset is not None:
        if preset not in recipe.presets:
            raise ValueError(
                f"Expected --preset among the recipe {recipe.name!r}'s presets "
                f"({', '.join(recipe.presets) or 'it has none'}), got {preset!r}."
            )
        base = recipe.presets[preset]
    sz = parse_sizes(sizes if sizes is not None else base.get("sizes", ()))
    bg = parse_budgets(budgets if budgets is not None else base.get("budgets", ()))
    sd = parse_seeds(seeds if seeds is not None else base.get("seeds", ()))
    # a preset's per-size budgets hold while its budgets do (an explicit --budgets applies to every size)
    per_size = (
        ()
        if budgets is not None
        else tuple((n, parse_budgets(b)) for n, b in dict(base.get("size_budgets", {})).items() if n in sz)
    )
    plan = GridPlan(sz, bg, sd, per_size)
    if isinstance(settings, GridSettings):
        st = settings
    else:
        fields = {**dict(base.get("settings", {})), **dict(settings or {})}
        if "betas" in fields:
            fields["betas"] = tuple(fields["betas"])
        try:
            st = GridSettings(**fields)
        except TypeError as e:
            raise ValueError(f"Expected settings among GridSettings' fields, got {e}.") from None
    opts = recipe.options_with({**dict(base.get("options", {})), **dict(options or {})})
    return plan, st, opts


def _cost(recipe: Recipe, size: str) -> float:
    try:
        return float(recipe.cost(size)) if recipe.cost is not None else 1.0
    except Exception:
        return 1.0


def _run_locked(
    recipe: Recipe,
    where: str,
    identity: dict[str, Any],
    plan: GridPlan,
    settings: GridSettings,
    opts: dict[str, Any],
    gkey: str,
    out: Path,
    executor: str,
    jobs: int,
    time_min: int,
    slurm: Mapping[str, Any],
    dry_run: bool,
    permutations: int,
    every: float | None,
    say: Callable[[str], None],
    processed: int,
    arms: tuple[str, ...] = (),
    configs: list[tuple[dict[str, Any], GridSettings, dict[str, Any], str, int]] | None = None,
) -> GridResult:
    from satmon.grid.jobs import make_executor

    cells_dir, jobs_dir = out / "cells", out / "jobs"
    cells_dir.mkdir(exist_ok=True)
    entries = _entries(out, plan, configs or [({}, settings, opts, gkey, processed)])
    done: dict[str, dict[str, Any]] = {}
    todo = []
    config = {**settings.shared(), **recipe.shared_options(opts)}
    adopted = 0
    for e in entries:
        cell = _complete(Path(e["cell"]), e["key"])
        if cell is None and "vary" not in e:
            cell = _adopt_legacy(cells_dir, e, config, recipe, settings, opts, processed, gkey, identity)
            adopted += cell is not None
        if cell is not None:
            done[e["name"]] = cell
            continue
        attempt, failed = _read_json(Path(e["attempt"])), _read_json(Path(e["failed"]))
        if isinstance(failed, dict):
            say(
                f"{e['name']}: its last run failed ({failed.get('error', '?')}; {_log_phrase(failed.get('log'))}); "
                "running it again"
            )
        elif isinstance(attempt, dict) and _alive(attempt.get("pid"), attempt.get("host")):
            from satmon.io.lock import OutputBusy

            raise OutputBusy(
                f"Expected no job still running on cell {e['name']} of {out}, got pid {attempt['pid']} "
                f"on {attempt.get('host')} (from an earlier grid whose command was killed; "
                f"{_log_phrase(attempt.get('log'))}): wait for it or kill it, then rerun.",
                {"pid": attempt["pid"], "host": attempt.get("host"), "cell": e["name"]},
            )
        elif isinstance(attempt, dict) and attempt.get("cancelled"):
            say(f"{e['name']}: its last job was cancelled (Ctrl-C); running it again")
        elif isinstance(attempt, dict):
            from satmon.grid.jobs import died_why

            say(
                f"{e['name']}: its last job died without a result (pid {attempt.get('pid')} on {attempt.get('host')}): "
                + died_why("", None, "", attempt.get("log"), "the job could not name one")
                + "; running it again"
            )
        todo.append(e)
    order = sorted(todo, key=lambda e: (plan.seeds.index(e["seed"]), -_cost(recipe, e["size"])))
    from satmon.grid.jobs import have_submitit, import_roots

    have_submitit()  # imported now if it is installed, so the jobs are held to the same submitit

    from satmon.grid.recipe import snapshot_recipe

    # a file recipe: the jobs import a copy of the file as keyed (made only when a cell is to run)
    job_spec = snapshot_recipe(where, identity, jobs_dir / "recipes") if todo else where
    shared = {
        "recipe": job_spec,
        "imports": import_roots(),
        "settings": settings.shared() | {"device": settings.device},
        "options": opts,
        "arms": list(arms or recipe.arms),
        "threads": int(slurm.get("cpus_per_task", 1)) if executor == "slurm" else 1,
        "jobs": jobs,
        "extra": {"key": None, "grid_key": gkey, "recipe": identity},
    }
    tasks = []
    for e in order:
        t = {
            **shared,
            **e,
            "extra": {
                **shared["extra"],
                "key": e["key"],
                **({"vary": e["vary"], "grid_key": e["grid_key"]} if "vary" in e else {}),
            },
        }
        tasks.append(t)
    if adopted:
        say(
            f"adopted {adopted} cells that examples/regime_grid.py wrote before satmon grid "
            "(cells/<name>.json with this "
            "grid's configuration)"
        )
    say(
        f"{len(entries)} cells ({len(done)} complete), {len(tasks)} to run, {settings.steps} steps each "
        f"(window {settings.window}), recipe {recipe.name} -> {out}"
    )
    status: dict[str, CellStatus] = {
        e["name"]: CellStatus(e["name"], e["key"], "done") for e in entries if e["name"] in done
    }
    interrupted = False
    if tasks:
        ex = make_executor(executor, jobs_dir, jobs, time_min, slurm, say, dry_run)
        if dry_run:
            return _dry_run(ex, tasks, jobs_dir, say, out, entries, done)
        say(f"executor: {ex.kind}" + (f", {ex.capacity} at a time" if ex.capacity else ""))
        try:
            _schedule(ex, tasks, recipe, settings, done, status, every, say)
        except KeyboardInterrupt:
            interrupted = True
    for e in entries:
        if e["name"] not in status:
            status[e["name"]] = CellStatus(
                e["name"], e["key"], "missing", "not run: the grid was interrupted" if interrupted else "not run"
            )
    result = _finish(
        recipe,
        where,
        identity,
        plan,
        settings,
        opts,
        gkey,
        out,
        entries,
        done,
        status,
        permutations,
        executor,
        jobs,
        say,
        final=not interrupted,
    )
    if interrupted:
        raise GridInterrupted(result)
    return result


def _adopt_legacy(
    cells_dir: Path,
    e: dict[str, Any],
    config: dict[str, Any],
    recipe: Recipe,
    settings: GridSettings,
    opts: dict[str, Any],
    processed: int,
    gkey: str,
    identity: dict[str, Any],
) -> dict[str, Any] | None:
    """A cell of ``examples/regime_grid.py`` before ``satmon grid`` (``cells/<name>.json``, no key), made with exactly
    this grid's configuration and the recipe's fields, as a keyed record (its ``code`` kept; ``adopted_from``
    names the file); else ``None``. The moved code gives such cells to the last digit (tests/grid/test_builtin.py)."""
    from satmon.grid.cell import recipe_fields

    legacy = cells_dir / f"{e['name']}.json"
    cell = _read_json(legacy)
    if not (
        isinstance(cell, dict)
        and cell.get("name") == e["name"]
        and cell.get("config") == config
        and "key" not in cell
        and "delta" in cell
        and "val_curve_dyt" in cell
        and cell.get("seed") == e["seed"]
    ):
        return None
    spec = make_spec(recipe, settings, opts, e["size"], Budget.parse(e["budget"]), e["seed"])
    if (
        any(cell.get(k) != v for k, v in recipe_fields(recipe, spec).items())
        or cell.get("train_tokens") != spec.unique_tokens
    ):
        return None
    best_d, best_l = cell["best_val_loss_dyt"], cell["best_val_loss_layernorm"]
    cell.update(
        {
            "passes": cell["epochs"],
            "delta_best": (best_d - best_l) / best_l,
            "helps_best": best_d < best_l,
            "best_step_dyt": min(cell["val_curve_dyt"], key=lambda sv: sv[1])[0],
            "best_step_layernorm": min(cell["val_curve_layernorm"], key=lambda sv: sv[1])[0],
            "batches_crc": None,
            "key": e["key"],
            "grid_key": gkey,
            "recipe": identity,
            "adopted_from": str(legacy),
        }
    )
    from satmon.grid.jobs import _write_json

    _write_json(Path(e["cell"]), cell)
    return cell


def _dry_run(
    ex: Any,
    tasks: list[dict[str, Any]],
    jobs_dir: Path,
    say: Callable[[str], None],
    out: Path,
    entries: list,
    done: dict,
) -> GridResult:
    from satmon.grid.jobs import SubmititSlurm, _write_json

    if not isinstance(ex, SubmititSlurm):
        raise ValueError("Expected --dry-run with --executor slurm (it writes the sbatch file), got a local executor.")
    jobs_dir.mkdir(parents=True, exist_ok=True)
    text = ex.submission_text(len(tasks))
    from satmon.io.atomic import atomic_write

    atomic_write(jobs_dir / "submission.sh", text)
    _write_json(jobs_dir / "tasks.json", tasks)
    say(
        f"dry run: {len(tasks)} cells as one SLURM array; sbatch file {jobs_dir / 'submission.sh'}, tasks "
        f"{jobs_dir / 'tasks.json'}; nothing submitted"
    )
    status = [CellStatus(e["name"], e["key"], "done" if e["name"] in done else "missing", "dry run") for e in entries]
    return GridResult(out, out / "grid.json", list(done.values()), status)


def _schedule(
    ex: Any,
    tasks: list[dict[str, Any]],
    recipe: Recipe,
    settings: GridSettings,
    done: dict[str, dict[str, Any]],
    status: dict[str, CellStatus],
    every: float | None,
    say: Callable[[str], None],
) -> None:
    """Submit ``tasks`` (at most ``ex.capacity`` at once), poll until all end; record each one's status."""
    if every is None:
        every = 30.0 if sys.stderr.isatty() else 120.0
    units = {t["name"]: _cost(recipe, t["size"]) for t in tasks}
    total = sum(units.values())
    by_name = {t["name"]: t for t in tasks}
    queue, running = list(tasks), {}
    t0 = last = time.perf_counter()
    finished_units = 0.0
    n_failed = 0
    try:
        while queue or running:
            room = len(queue) if ex.capacity is None else ex.capacity - len(running)
            if room > 0 and queue:
                batch, queue = queue[:room], queue[room:]
                for h in ex.submit(batch):
                    running[h.name] = h
            time.sleep(0.2)
            for name, h in list(running.items()):
                if not ex.ended(h):
                    continue
                del running[name]
                t = by_name[name]
                cell = _complete(Path(t["cell"]), t["key"])
                finished_units += units[name]
                if cell is not None:
                    done[name] = cell
                    status[name] = CellStatus(name, t["key"], "done", log=h.log)
                    from satmon.grid.analysis import cell_line

                    say(f"{len(done)} done | {cell_line({**cell, 'name': name})}")
                    continue
                n_failed += 1
                failed = _read_json(Path(t["failed"]))
                if isinstance(failed, dict):
                    why = f"failed: {failed.get('error', '?')}"
                    where = f"log {h.log}" if os.path.isfile(h.log) else f"no log: {ex.no_log_why(h)}"
                else:
                    why, where = f"died without a result: {ex.died_why(h)}", ""
                status[name] = CellStatus(
                    name,
                    t["key"],
                    "failed" if isinstance(failed, dict) else "died",
                    why,
                    h.log if os.path.isfile(h.log) else None,
                )
                say(f"{name} {why}" + (f"; {where}" if where else "") + "; a rerun of the same command runs it again")
            now = time.perf_counter()
            if now - last >= every and (running or queue):
                last = now
                partial = {n: _share(Path(by_name[n]["progress"])) for n in running}
                work = finished_units + sum(units[n] * f for n, f in partial.items())
                eta = (
                    f"~{(now - t0) / work * (total - work) / 60:.0f} min left"
                    if work > 0
                    else "ETA after the first progress report"
                )
                say(
                    f"{len(done)} done, {len(running)} running ("
                    + ", ".join(f"{n} {100 * f:.0f}%" for n, f in sorted(partial.items()))
                    + f"), {len(queue)} queued, "
                    f"{n_failed} failed; {(now - t0) / 60:.1f} min; {eta}"
                )
    except KeyboardInterrupt:
        ex.cancel(list(running.values()))
        from satmon.grid.jobs import _write_json

        for name in running:  # a rerun says "cancelled", not "died"
            attempt = _read_json(Path(by_name[name]["attempt"]))
            if isinstance(attempt, dict):
                try:
                    _write_json(Path(by_name[name]["attempt"]), {**attempt, "cancelled": True})
                except OSError:
                    pass
        for name, h in running.items():
            status[name] = CellStatus(
                name, by_name[name]["key"], "missing", "interrupted (Ctrl-C): its job was cancelled", h.log
            )
        raise


def _share(path: Path) -> float:
    try:
        a, b = path.read_text().split()
        return int(a) / int(b)
    except (OSError, ValueError, ZeroDivisionError):
        return 0.0


def _finish(
    recipe: Recipe,
    where: str,
    identity: dict[str, Any],
    plan: GridPlan,
    settings: GridSettings,
    opts: dict[str, Any],
    gkey: str,
    out: Path,
    entries: list[dict[str, Any]],
    done: dict[str, dict[str, Any]],
    status: dict[str, CellStatus],
    permutations: int,
    executor: str,
    jobs: int,
    say: Callable[[str], None],
    final: bool,
) -> GridResult:
    from satmon.grid.analysis import (
        analyze,
        answer_text,
        forecast_check,
        phase_rows,
        report_markdown,
    )
    from satmon.grid.cell import environment
    from satmon.grid.store import write_grid, write_phase_csv

    cost = {e["name"]: _cost(recipe, e["size"]) for e in entries}
    cells = sorted(done.values(), key=lambda c: (cost.get(c["name"], 1.0), c["train_tokens"], c["seed"]))
    analysis = analyze(cells, permutations) if cells else {}
    forecast = forecast_check(cells, settings.steps * recipe.step_tokens(opts))
    text = answer_text(recipe.name, cells, analysis, forecast, [s for s in status.values() if s.state != "done"])
    st = [status[e["name"]] for e in entries]
    json_path = out / "grid.json"
    write_grid(
        json_path,
        format_=FORMAT,
        recipe=identity,
        plan=plan.to_json(),
        settings=settings.shared(),
        options=recipe.shared_options(opts),
        key=gkey,
        environment=environment(1, jobs),
        executor=executor,
        cells=cells,
        status=st,
        analysis=analysis,
        forecast=forecast,
    )
    write_phase_csv(out / "phase_grid.csv", phase_rows(cells, f"satmon grid: {recipe.name} ({out.name})"))
    if cells:
        from satmon.io.atomic import atomic_write

        atomic_write(out / "report.md", report_markdown(analysis, cells) + "\n\n" + text + "\n")
    if final:
        for line in text.splitlines():
            say(line)
        say(
            f"wrote {json_path}, {out / 'phase_grid.csv'}"
            + (f", {out / 'report.md'}" if cells else "")
            + f"; draw the cells on the study's phase diagram: satmon report --plot --cells {json_path}"
        )
    return GridResult(out, json_path, cells, st, analysis, text)
