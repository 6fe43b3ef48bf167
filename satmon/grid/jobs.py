"""Cells as jobs: the job function every executor runs, and the executors (submitit's local and SLURM, or plain
local processes where submitit is not installed).

A job is :func:`run_job` on a *task* (plain JSON: the recipe's spec, the settings, the options, the cell's axes,
the files it writes and the folders the grid imported satmon and submitit from). Every executor starts its job
processes in the job folder with :func:`job_environment` (the one place that decides what a job imports: what
the submitting process imported, never the working folder's code); the job checks its satmon and submitit are
the grid's, imports the recipe (a file recipe from the grid's copy of it) and refuses one whose code is not
the cell key's, marks its attempt (``<cell>.attempt.json``: pid, host, job id, its log), measures the cell and
writes ``<cell>.json`` atomically; an error the job can catch is kept in ``<cell>.failed.json``. A job that
ended without either (SIGKILL, out of memory, a node lost, a preemption, a failure before its cell) is
reported by :meth:`Executor.died_why` (its real cause, its log or why none) and runs again on the next run.
The cell file is the only truth of "done".
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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Executor",
    "Handle",
    "LocalProcesses",
    "SubmititLocal",
    "SubmititSlurm",
    "have_submitit",
    "make_executor",
    "run_job",
]


def have_submitit() -> bool:
    """Whether submitit (the ``grid`` extra) can be imported."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------- what a job process imports
def import_roots() -> dict[str, str | None]:
    """The folders this process imported ``satmon`` and ``submitit`` from (``None``: submitit not imported).

    Example:
        >>> import satmon
        >>> import_roots()["satmon"] == str(Path(satmon.__file__).resolve().parent)
        True
    """
    out: dict[str, str | None] = {}
    for name in ("satmon", "submitit"):
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None) if module is not None else None
        out[name] = str(Path(where).resolve().parent) if where else None
    return out


def job_pythonpath() -> list[str]:
    """The ``PYTHONPATH`` of every job: this process's absolute ``PYTHONPATH`` entries (an empty, ``.`` or relative
    entry would name the job's working folder, so it is dropped), and the folder this process imported satmon or
    submitit from where only its working directory or its script's folder put it on ``sys.path`` (``python -m``
    in a satmon checkout): a job imports what the submitting process imported, never its working folder's."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e and os.path.isabs(e)]
    implicit = {os.path.realpath(os.getcwd()) if os.path.isdir(".") else ""}
    if sys.path and isinstance(sys.path[0], str):
        implicit.add(os.path.realpath(sys.path[0] or "."))
    for root in import_roots().values():
        parent = str(Path(root).parent) if root else ""
        if parent and parent in implicit and parent not in entries:
            entries.insert(0, parent)
    return entries


def job_environment(threads: int = 1) -> dict[str, str]:
    """The environment variables a job process starts with, over this process's: one torch thread each,
    ``PYTHONSAFEPATH=1`` (Python 3.11+ puts no working directory on ``sys.path`` for ``-m``) and
    :func:`job_pythonpath` (``""``: unset). Every executor starts its jobs with them, in the job folder."""
    return {"OMP_NUM_THREADS": str(threads), "PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(job_pythonpath())}


@contextmanager
def _job_process_start(folder: Path) -> Iterator[None]:
    """This process's working folder and :func:`job_environment` while a local job is started (submitit's local
    controller inherits both; it is started without a shell so that cancelling it reaches its job), restored after."""
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "PYTHONSAFEPATH", "PYTHONPATH")}
    cwd = os.getcwd()
    try:
        for k, v in job_environment().items():
            if v:
                os.environ[k] = v
            else:
                os.environ.pop(k, None)
        os.chdir(folder)
        yield
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _shell_setup(folder: Path, threads: int = 1) -> list[str]:
    """The shell lines that start a submitit job (local controller or SLURM script) in ``folder`` with
    :func:`job_environment`."""
    lines = [f"cd {shlex.quote(str(folder.absolute()))}"]
    for k, v in job_environment(threads).items():
        lines.append(f"export {k}={shlex.quote(v)}" if v else f"unset {k}")
    return lines


def check_imports(expected: Mapping[str, str | None] | None) -> None:
    """In a job: refuse to measure with another satmon or submitit than the submitting process imported
    (``expected``: its :func:`import_roots`), naming both folders."""
    if not expected:
        return
    got = import_roots()
    for name, want in expected.items():
        if want and got.get(name) and got[name] != want:
            raise RuntimeError(
                f"Expected the job to import {name} from {want} (as the grid that submitted it did), "
                "got "
                f"{got[name]}: run the grid where its jobs see the same installation (on SLURM, the "
                "same Python environment on every node)."
            )


def _own_log(task: Mapping[str, Any]) -> str | None:
    """The job's own log: the plain-process executor names it in the task; submitit's job finds it from its
    environment."""
    if task.get("log"):
        return str(task["log"])
    if os.environ.get("SUBMITIT_EXECUTOR"):
        try:
            import submitit

            return str(submitit.JobEnvironment().paths.stderr)
        except Exception:  # not a submitit job after all: no log to name
            return None
    return None


def _write_json(path: Path, obj: Any) -> None:
    from satmon.io.atomic import atomic_write

    atomic_write(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


def run_job(task: Mapping[str, Any]) -> str:
    """Measure one cell as a job and write its record; returns the record's path.

    ``task`` holds ``recipe`` (the spec a job imports), ``settings``, ``options``, ``size``, ``budget``, ``seed``,
    ``threads``, ``key``, ``extra`` and the paths ``cell``, ``attempt``, ``failed``, ``progress``, ``log``.
    """
    os.environ.setdefault("OMP_NUM_THREADS", str(task.get("threads", 1)))
    check_imports(task.get("imports"))  # before anything is written: this job measures with the grid's code
    from satmon.errors import error_line
    from satmon.grid.cell import make_spec, measure_cell
    from satmon.grid.config import Budget, GridSettings
    from satmon.grid.recipe import check_identity, load_recipe
    from satmon.replaying.user_code import no_working_directory

    cell, attempt, failed, prog = (Path(task[k]) for k in ("cell", "attempt", "failed", "progress"))
    log = _own_log(task)
    failed.unlink(missing_ok=True)
    _write_json(
        attempt,
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
            "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
            "log": log,
        },
    )
    try:
        import logging
        import warnings

        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        logging.getLogger("satmon").setLevel(logging.ERROR)
        with no_working_directory():
            recipe, _ = load_recipe(task["recipe"])
        if (task.get("extra") or {}).get("recipe"):  # the code the key names, or no cell at all
            check_identity(recipe, task["extra"]["recipe"])
        s = dict(task["settings"])
        s["betas"] = tuple(s.get("betas", (0.9, 0.95)))
        settings = GridSettings(**s)
        spec = make_spec(
            recipe,
            settings,
            recipe.options_with(task["options"]),
            task["size"],
            Budget.parse(task["budget"]),
            int(task["seed"]),
        )
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

        record = measure_cell(
            recipe,
            settings,
            spec,
            threads=int(task.get("threads", 1)),
            progress=progress,
            extra=task.get("extra"),
            arms=arms,
            jobs=int(task.get("jobs", 1)),
        )
        record["name"] = str(task.get("name") or record["name"])  # a --vary cell's name holds its values
        _write_json(cell, record)
    except KeyboardInterrupt:  # cancelled (Ctrl-C in the grid, scancel): not a failure of the cell
        try:
            _write_json(attempt, {**(json.loads(attempt.read_text()) if attempt.exists() else {}), "cancelled": True})
        except (OSError, ValueError):
            pass
        raise
    except BaseException as e:
        try:
            _write_json(
                failed,
                {
                    "error": error_line(e),
                    "type": type(e).__name__,
                    "log": log,
                    "traceback": traceback.format_exc()[-4000:],
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                },
            )
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

    def exit_code(self, handle: Handle) -> int | None:
        """The ended job's exit code where the executor knows it (negative: killed by that signal), else ``None``."""
        return None

    def state(self, handle: Handle) -> str:
        """The scheduler's state of an ended job (SLURM's ``OUT_OF_MEMORY``, ``TIMEOUT``...), ``""`` if none."""
        return ""

    def no_log_why(self, handle: Handle) -> str:
        """Why an ended job left no log file."""
        return "the job ended before it opened one"

    def died_why(self, handle: Handle) -> str:
        """Why a job ended without a result and without an error it caught (:func:`died_why`)."""
        return died_why(
            self.exit_note(handle), self.exit_code(handle), self.state(handle), handle.log, self.no_log_why(handle)
        )

    def cancel(self, handles: Sequence[Handle]) -> None:
        raise NotImplementedError


#: What a scheduler's end state says of a job that left no result.
_STATES = {
    "OUT_OF_MEMORY": "out of memory (the scheduler killed it)",
    "TIMEOUT": "over its time limit (--time)",
    "PREEMPTED": "preempted by the scheduler",
    "NODE_FAIL": "its node failed",
    "CANCELLED": "cancelled (scancel, or the scheduler)",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "past its deadline",
}


def last_error_line(log: str | None, limit: int = 65_536) -> str | None:
    """The last line of a job's log that names an error (a Python exception's last line, the kernel's ``Killed``,
    a scheduler's ``CANCELLED`` or ``oom-kill``), made printable and cut to 300 characters; ``None``: none.

    Example:
        >>> import tempfile
        >>> log = tempfile.mktemp()
        >>> _ = open(log, "w").write(chr(10).join(["Traceback (most recent call last):", "  ...",
        ...                                         "OSError: [Errno 28] No space left on device", ""]))
        >>> last_error_line(log)
        'OSError: [Errno 28] No space left on device'
    """
    import re

    from satmon.io.safe_text import printable

    if not log:
        return None
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    pattern = re.compile(
        r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*|.*\b(Killed|oom[-_ ]kill|"
        r"Out Of Memory|CANCELLED|DUE TO TIME LIMIT|PREEMPT\w*)\b.*)$",
        re.IGNORECASE,
    )
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and pattern.match(line):
            return printable(line)[:300]
    return None


def died_why(note: str, code: int | None, state: str, log: str | None, no_log: str) -> str:
    """Why a job ended without a result (its cell's file) and without an error it caught, from what is known: a
    signal or an exit code, a scheduler's state, and its log's last error line; then its log, or why there is none.

    Example:
        >>> died_why("process 7 exit code -9", -9, "", None, "it ended first")
        'killed by SIGKILL (out of memory, or killed from outside) (process 7 exit code -9); no log: it ended first'
    """
    import signal as _signal

    causes = []
    if code is not None and code < 0:
        try:
            name = _signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        causes.append(f"killed by {name}" + (" (out of memory, or killed from outside)" if name == "SIGKILL" else ""))
    elif state.split(" ")[0] in _STATES:
        causes.append(_STATES[state.split(" ")[0]])
    elif code:
        causes.append(f"exited with code {code}")
    error = last_error_line(log)
    if error:
        causes.append(f"its log ends with {error!r}")
    if not causes:
        causes.append("no error in its log: killed from outside (SIGKILL, out of memory), preempted or its node lost")
    where = f"log {log}" if log and os.path.isfile(log) else f"no log: {no_log}"
    return f"{'; '.join(causes)}" + (f" ({note})" if note else "") + f"; {where}"


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
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder.absolute()
        self.ex = submitit.LocalExecutor(folder=str(self.folder))
        self.ex.update_parameters(timeout_min=timeout_min)

    def submit(self, tasks: Sequence[Mapping[str, Any]]) -> list[Handle]:
        out = []
        with _job_process_start(self.folder):  # the controller and its job: never the working folder's code
            for t in tasks:
                job = self.ex.submit(run_job, dict(t))
                out.append(Handle(t["name"], job, str(job.paths.stderr)))
        return out

    def cancel(self, handles: Sequence[Handle]) -> None:
        super().cancel(handles)  # SIGINT to each controller, which stops its job (SIGINT, then SIGKILL)
        for h in handles:  # wait for them, so a rerun never finds the cancelled job still running
            proc = getattr(h.job, "_process", None)
            try:
                if proc is not None:
                    proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    def exit_note(self, handle: Handle) -> str:
        code = self._controller_code(handle)
        return f"job {handle.job.job_id} state {handle.job.state}" + (
            f", exit code {code}" if code not in (None, 0) else ""
        )

    @staticmethod
    def _controller_code(handle: Handle) -> int | None:
        proc = getattr(handle.job, "_process", None)
        return proc.poll() if proc is not None else None

    def exit_code(self, handle: Handle) -> int | None:
        return self._controller_code(handle) or None  # the controller's: 0 says nothing of its job's end

    def no_log_why(self, handle: Handle) -> str:
        return (
            "submitit's controller ended before it started the job (what it printed went to this grid's stderr, above)"
        )


def slurm_parameters(
    partition: str | None,
    gpus_per_cell: int,
    time_min: int,
    max_parallel: int,
    cpus_per_cell: int,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The SLURM job parameters of a grid, as submitit's ``SlurmExecutor.update_parameters`` takes them.

    Example:
        >>> slurm_parameters("gpu", 1, 60, 4, 2)["array_parallelism"]
        4
    """
    p: dict[str, Any] = {
        "job_name": "satmon-grid",
        "time": time_min,
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": cpus_per_cell,
        "array_parallelism": max_parallel,
    }
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

        self.folder, self.parameters = folder.absolute(), dict(parameters)
        # every array task starts in the job folder with job_environment(): never the submission folder's code
        threads = int(self.parameters.get("cpus_per_task", 1))
        self.parameters["setup"] = [*self.parameters.get("setup", []), *_shell_setup(self.folder, threads)]
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

    def state(self, handle: Handle) -> str:
        return str(handle.job.state)

    def no_log_why(self, handle: Handle) -> str:
        return "SLURM wrote none (the job never started on a node)"


class LocalProcesses(Executor):
    """Without submitit: each cell a plain local process (``python -m satmon.grid.jobs TASK.json``), at most ``jobs``
    at once, one thread each; its output in ``folder/<cell>.log``."""

    kind = "local (plain processes: submitit not installed)"

    def __init__(self, folder: Path, jobs: int) -> None:
        self.folder, self.capacity = folder, jobs
        folder.mkdir(parents=True, exist_ok=True)

    def submit(self, tasks: Sequence[Mapping[str, Any]]) -> list[Handle]:
        out = []
        env = {**os.environ, **job_environment()}
        if not env["PYTHONPATH"]:
            env.pop("PYTHONPATH")
        for t in tasks:
            task_file = (self.folder / f"{Path(t['cell']).stem}.task.json").absolute()
            log = (self.folder / f"{Path(t['cell']).stem}.log").absolute()
            _write_json(task_file, {**dict(t), "log": str(log)})
            with open(log, "ab") as f:  # in the job folder with job_environment(): never the working folder's code
                proc = subprocess.Popen(
                    [sys.executable, "-m", "satmon.grid.jobs", str(task_file)],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(self.folder.absolute()),
                )
            out.append(Handle(t["name"], proc, str(log)))
        return out

    def exit_code(self, handle: Handle) -> int | None:
        return handle.job.poll()

    def ended(self, handle: Handle) -> bool:
        return handle.job.poll() is not None

    def exit_note(self, handle: Handle) -> str:
        code = handle.job.poll()
        return f"process {handle.job.pid} exit code {code}" + (
            f" (signal {-code})" if code is not None and code < 0 else ""
        )

    def cancel(self, handles: Sequence[Handle]) -> None:
        for h in handles:
            if h.job.poll() is None:
                h.job.terminate()
        for h in handles:
            try:
                h.job.wait(timeout=10)
            except subprocess.TimeoutExpired:
                h.job.kill()


def make_executor(
    kind: str,
    folder: Path,
    jobs: int,
    time_min: int,
    slurm: Mapping[str, Any] | None = None,
    say: Any = None,
    dry_run: bool = False,
) -> Executor:
    """The executor ``kind`` (``"local"`` or ``"slurm"``) over the job folder ``folder``."""
    if kind == "slurm":
        if not have_submitit():
            raise ValueError(
                "Expected submitit for --executor slurm, got none installed: pip install 'satmon[grid]' "
                "(or pip install submitit)."
            )
        import shutil

        if not dry_run and (shutil.which("sbatch") is None or shutil.which("srun") is None):
            raise ValueError(
                "Expected sbatch and srun on PATH for --executor slurm (run on a SLURM login node), got "
                "none: run there, or add --dry-run to write the sbatch file and see what would be submitted."
            )
        return SubmititSlurm(folder, slurm or {})
    if kind != "local":
        raise ValueError(f"Expected --executor local or slurm, got {kind!r}.")
    if have_submitit():
        return SubmititLocal(folder, jobs, time_min)
    if say is not None:
        say(
            "submitit is not installed: cells run as plain local processes (pip install 'satmon[grid]' adds submitit "
            "and --executor slurm)"
        )
    return LocalProcesses(folder, jobs)


def _main(argv: list[str]) -> int:  # python -m satmon.grid.jobs TASK.json: the plain-process executor's job
    if len(argv) != 1:
        print(f"usage: python -m satmon.grid.jobs TASK.json (got {shlex.join(argv)})", file=sys.stderr)
        return 2
    run_job(json.loads(Path(argv[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
