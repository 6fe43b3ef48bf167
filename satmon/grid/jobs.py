"""Cells as jobs: the job function every executor runs, and the executors (submitit's local and SLURM, or plain
local processes where submitit is not installed).

A job is :func:`run_job` on a *task* (plain JSON: the recipe's spec, the settings, the options, the cell's axes
and the files it writes). The job imports the recipe itself (the same loader as the parent, the working
directory not searched), marks its attempt (``<cell>.attempt.json``: pid, host, job id, log), measures the
cell and writes ``<cell>.json`` atomically; an error the job can catch is kept in ``<cell>.failed.json``. A job
killed from outside (SIGKILL, out of memory, a node lost, a preemption) leaves its attempt and no result: the
grid reports it with its log and runs it again on the next run. The cell file is the only truth of "done".
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Executor", "Handle", "LocalProcesses", "SubmititLocal", "SubmititSlurm", "have_submitit", "make_executor",
           "run_job"]


def have_submitit() -> bool:
    """Whether submitit (the ``grid`` extra) can be imported."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        return False
    return True


def _write_json(path: Path, obj: Any) -> None:
    from satmon.io.atomic import atomic_write

    atomic_write(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


def run_job(task: Mapping[str, Any]) -> str:
    """Measure one cell as a job and write its record; returns the record's path.

    ``task`` holds ``recipe`` (the spec a job imports), ``settings``, ``options``, ``size``, ``budget``, ``seed``,
    ``threads``, ``key``, ``extra`` and the paths ``cell``, ``attempt``, ``failed``, ``progress``, ``log``.
    """
    os.environ.setdefault("OMP_NUM_THREADS", str(task.get("threads", 1)))
    from satmon.grid.cell import make_spec, measure_cell
    from satmon.grid.config import Budget, GridSettings
    from satmon.grid.recipe import load_recipe
    from satmon.replay.user_code import error_line, no_working_directory

    cell, attempt, failed, prog = (Path(task[k]) for k in ("cell", "attempt", "failed", "progress"))
    failed.unlink(missing_ok=True)
    _write_json(attempt, {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                          "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
                          "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"), "log": task.get("log")})
    try:
        import logging
        import warnings

        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        logging.getLogger("satmon").setLevel(logging.ERROR)
        with no_working_directory():
            recipe, _ = load_recipe(task["recipe"])
        s = dict(task["settings"])
        s["betas"] = tuple(s.get("betas", (0.9, 0.95)))
        settings = GridSettings(**s)
        spec = make_spec(recipe, settings, recipe.options_with(task["options"]), task["size"], Budget.parse(task["budget"]),
                         int(task["seed"]))
        steps = settings.steps
        arms = tuple(task.get("arms") or recipe.arms)

        def progress(arm: str, step: int) -> None:  # the parent reads it for the ETA; never fatal
            try:
                done = step + steps * arms.index(arm)
                tmp = prog.with_name(prog.name + ".tmp")
                tmp.write_text(f"{done} {len(arms) * steps}\n")
                tmp.replace(prog)
            except OSError:
                pass

        record = measure_cell(recipe, settings, spec, threads=int(task.get("threads", 1)), progress=progress,
                              extra=task.get("extra"), arms=arms,
                              jobs=int(task.get("jobs", 1)))
        _write_json(cell, record)
    except KeyboardInterrupt:  # cancelled (Ctrl-C in the grid, scancel): not a failure of the cell
        try:
            _write_json(attempt, {**(json.loads(attempt.read_text()) if attempt.exists() else {}), "cancelled": True})
        except (OSError, ValueError):
            pass
        raise
    except BaseException as e:
        try:
            _write_json(failed, {"error": error_line(e), "type": type(e).__name__, "log": task.get("log"),
                                 "traceback": traceback.format_exc()[-4000:], "host": socket.gethostname(), "pid": os.getpid()})
        except Exception:
            pass
        raise
    finally:
        prog.unlink(missing_ok=True)
    attempt.unlink(missing_ok=True)
    return str(cell)


# ---------------------------------------------------------------------------------------------- executors
@dataclass
class Handle:
    """A submitted cell: its name, the executor's job object, its log path."""

    name: str
    job: Any
    log: str


class Executor:
    """Submits tasks, says which have ended, cancels. ``capacity``: how many may run at once (``None``: all)."""

    kind = "?"
    capacity: int | None = None

    def submit(self, tasks: Sequence[Mapping[str, Any]]) -> list[Handle]:
        raise NotImplementedError

    def ended(self, handle: Handle) -> bool:
        raise NotImplementedError

    def exit_note(self, handle: Handle) -> str:
        """What the executor knows of how an ended job ended (an exit code, a state)."""
        return ""

    def cancel(self, handles: Sequence[Handle]) -> None:
        raise NotImplementedError


class _Submitit(Executor):
    """What submitit's job objects answer alike, local or SLURM."""

    def ended(self, handle: Handle) -> bool:
        return handle.job.done()

    def cancel(self, handles: Sequence[Handle]) -> None:
        for h in handles:
            try:
                h.job.cancel(check=False)
            except Exception:  # a job that ended meanwhile: nothing to cancel
                pass


class SubmititLocal(_Submitit):
    """submitit's ``LocalExecutor``: each cell a local job (a controller process and the job's process), at most
    ``jobs`` at once, one thread each; logs in ``folder`` (``<job id>_0_log.out`` / ``.err``)."""

    kind = "local (submitit)"

    def __init__(self, folder: Path, jobs: int, timeout_min: float) -> None:
        import submitit

        self.capacity = jobs
        self.ex = submitit.LocalExecutor(folder=str(folder))
        self.ex.update_parameters(timeout_min=timeout_min)

    def submit(self, tasks: Sequence[Mapping[str, Any]]) -> list[Handle]:
        out = []
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # the job inherits this environment: one thread each
        try:
            for t in tasks:
                job = self.ex.submit(run_job, dict(t))
                out.append(Handle(t["name"], job, str(job.paths.stderr)))
        finally:
            if old is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = old
        return out

    def exit_note(self, handle: Handle) -> str:
        proc = getattr(handle.job, "_process", None)
        code = proc.poll() if proc is not None else None
        return f"job {handle.job.job_id} state {handle.job.state}" + (f", exit code {code}" if code not in (None, 0) else "")


def slurm_parameters(partition: str | None, gpus_per_cell: int, time_min: int, max_parallel: int,
                     cpus_per_cell: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The SLURM job parameters of a grid, as submitit's ``SlurmExecutor.update_parameters`` takes them.

    Example:
        >>> slurm_parameters("gpu", 1, 60, 4, 2)["array_parallelism"]
        4
    """
    p: dict[str, Any] = {"job_name": "satmon-grid", "time": time_min, "nodes": 1, "ntasks_per_node": 1,
                         "cpus_per_task": cpus_per_cell, "array_parallelism": max_parallel}
    if partition:
        p["partition"] = partition
    if gpus_per_cell:
        p["gpus_per_node"] = gpus_per_cell
    p.update(extra or {})
    return p


class SubmititSlurm(_Submitit):
    """submitit's ``SlurmExecutor``: every cell to run, one job array (``--max-parallel`` of it at once). The
    executor is made at the first submission (submitit requires ``srun`` on PATH); the sbatch text of a dry run
    comes from submitit's own ``_make_sbatch_string``, which needs no cluster."""

    kind = "slurm (submitit)"

    def __init__(self, folder: Path, parameters: Mapping[str, Any]) -> None:
        from submitit.slurm.slurm import _make_sbatch_string

        self.folder, self.parameters = folder, dict(parameters)
        _make_sbatch_string(command="nothing to do", folder=str(folder), **self.parameters)  # submitit checks them
        self.ex: Any = None

    def submission_text(self, n: int) -> str:
        """The sbatch file submitit would submit for an array of ``n`` cells (no cluster needed)."""
        from submitit.slurm.slurm import _make_sbatch_string

        command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(self.folder))])
        return _make_sbatch_string(command=command, folder=str(self.folder), map_count=n, **self.parameters)

    def submit(self, tasks: Sequence[Mapping[str, Any]]) -> list[Handle]:
        if self.ex is None:
            import submitit

            self.ex = submitit.SlurmExecutor(folder=str(self.folder))
            self.ex.update_parameters(**self.parameters)
        jobs = self.ex.map_array(run_job, [dict(t) for t in tasks])
        return [Handle(t["name"], j, str(j.paths.stderr)) for t, j in zip(tasks, jobs)]

    def exit_note(self, handle: Handle) -> str:
        return f"SLURM job {handle.job.job_id} state {handle.job.state}"


class LocalProcesses(Executor):
    """Without submitit: each cell a plain local process (``python -m satmon.grid.jobs TASK.json``), at most ``jobs``
    at once, one thread each; its output in ``folder/<cell>.log``."""

    kind = "local (plain processes: submitit not installed)"

    def __init__(self, folder: Path, jobs: int) -> None:
        self.folder, self.capacity = folder, jobs
        folder.mkdir(parents=True, exist_ok=True)

    def submit(self, tasks: Sequence[Mapping[str, Any]]) -> list[Handle]:
        out = []
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for t in tasks:
            task_file = self.folder / f"{Path(t['cell']).stem}.task.json"
            _write_json(task_file, dict(t))
            log = self.folder / f"{Path(t['cell']).stem}.log"
            with open(log, "ab") as f:
                proc = subprocess.Popen([sys.executable, "-m", "satmon.grid.jobs", str(task_file)], stdout=f,
                                        stderr=subprocess.STDOUT, env=env, cwd=str(self.folder))
            out.append(Handle(t["name"], proc, str(log)))
        return out

    def ended(self, handle: Handle) -> bool:
        return handle.job.poll() is not None

    def exit_note(self, handle: Handle) -> str:
        code = handle.job.poll()
        return f"process {handle.job.pid} exit code {code}" + (f" (signal {-code})" if code is not None and code < 0 else "")

    def cancel(self, handles: Sequence[Handle]) -> None:
        for h in handles:
            if h.job.poll() is None:
                h.job.terminate()
        for h in handles:
            try:
                h.job.wait(timeout=10)
            except subprocess.TimeoutExpired:
                h.job.kill()


def make_executor(kind: str, folder: Path, jobs: int, time_min: int, slurm: Mapping[str, Any] | None = None,
                  say: Any = None, dry_run: bool = False) -> Executor:
    """The executor ``kind`` (``"local"`` or ``"slurm"``) over the job folder ``folder``."""
    if kind == "slurm":
        if not have_submitit():
            raise ValueError("Expected submitit for --executor slurm, got none installed: pip install 'satmon[grid]' "
                             "(or pip install submitit).")
        import shutil

        if not dry_run and (shutil.which("sbatch") is None or shutil.which("srun") is None):
            raise ValueError("Expected sbatch and srun on PATH for --executor slurm (run on a SLURM login node), got "
                             "none: run there, or add --dry-run to write the sbatch file and see what would be submitted.")
        return SubmititSlurm(folder, slurm or {})
    if kind != "local":
        raise ValueError(f"Expected --executor local or slurm, got {kind!r}.")
    if have_submitit():
        return SubmititLocal(folder, jobs, time_min)
    if say is not None:
        say("submitit is not installed: cells run as plain local processes (pip install 'satmon[grid]' adds submitit "
            "and --executor slurm)")
    return LocalProcesses(folder, jobs)


def _main(argv: list[str]) -> int:  # python -m satmon.grid.jobs TASK.json: the plain-process executor's job
    if len(argv) != 1:
        print(f"usage: python -m satmon.grid.jobs TASK.json (got {shlex.join(argv)})", file=sys.stderr)
        return 2
    run_job(json.loads(Path(argv[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
