"""``satmon grid`` as a cluster job demands (issue 48.1): jobs import the grid's code from a hostile folder, a killed,
cancelled or orphaned job is held in place while the test acts on it, an edited recipe trains no cell under the
first key, a diverged arm is an outcome, settings that cannot work are refused before any work, and a job that
died says why. Every interrupt acts on a job that waits for a file (tests/grid/held_recipe.py), never on one the
machine may already have finished."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from grid_helpers import satmon_cli

from helpers import popen_as_from_a_terminal

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: The parent as the installed console script runs it: the working directory is not on its sys.path.
CLI = [sys.executable, "-c", "import sys; del sys.path[0]; from satmon.cli.main import main; sys.exit(main())"]
HELD = ["grid", "held.py:RECIPE", "--smoke", "--out", "g", "--jobs", "1", "--permutations", "5"]


def _held_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    shutil.copy(HERE / "held_recipe.py", tmp_path / "held.py")
    hold = tmp_path / "hold"
    hold.mkdir()
    return hold, {**os.environ, "SATMON_TEST_HOLD": str(hold)}


def _wait(pred, what: str, proc: subprocess.Popen | None = None, timeout: float = 300.0):
    """Poll for an event the test caused (a job started and is waiting); a subject that ended first fails at once."""
    t0 = time.monotonic()
    while True:
        got = pred()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the grid ended (exit {proc.returncode}) before {what}: {proc.stdout.read()[-3000:]}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _held_job(hold: Path, out: Path, not_pid: int | None = None) -> dict | None:
    """The attempt of the job now waiting in ``data()`` (its started marker and its attempt file both written)."""
    pids = {int(p.name.split(".")[1]) for p in hold.glob("started.*")} - {not_pid}
    for a in (out / "cells").glob("*.attempt.json") if (out / "cells").exists() else ():
        try:
            attempt = json.loads(a.read_text())
        except ValueError:
            continue
        if attempt.get("pid") in pids:
            return attempt
    return None


def _popen(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return popen_as_from_a_terminal(CLI + args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        text, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return text


def test_a_held_job_killed_a_busy_folder_ctrl_c_and_an_orphan_then_rerun_resumes(tmp_path):
    """A job waits in its cell while: a second grid into the folder is refused naming the first (exit 3); the job is
    SIGKILLed (exit 1, said with its log); a rerun names the dead job and is stopped by Ctrl-C while its job waits
    (exit 130); a rerun whose command is SIGKILLed leaves its job running, and the next rerun is refused naming that
    job and its log (exit 3, one meaning: --out is in use); once that job is gone the last rerun completes."""
    hold, env = _held_folder(tmp_path)
    out = tmp_path / "g"
    first = _popen(HELD, tmp_path, env)
    job = _wait(lambda: _held_job(hold, out), "the first job to wait in its cell", first)
    busy = satmon_cli(*HELD, cwd=tmp_path, env=env, timeout=120)
    assert busy.returncode == 3 and f"pid {first.pid}" in busy.stderr and "in use by" in busy.stderr, busy.stderr
    os.kill(job["pid"], signal.SIGKILL)  # mid-cell: out of memory, killed from outside
    text = _finish(first)
    assert first.returncode == 1, text
    assert "died without a result" in text and "a rerun of the same command runs it again" in text, text
    assert "log None" not in text
    data = json.loads((out / "grid.json").read_text())
    assert data["counts"]["failed"] == 1 and data["not_complete"][0]["state"] == "died"
    assert data["not_complete"][0]["log"] == job["log"] and Path(job["log"]).is_file() and data["cells"] == []
    # the rerun names the dead job (pid and log), then Ctrl-C while its own job waits in the cell
    second = _popen(HELD, tmp_path, env)
    _wait(lambda: _held_job(hold, out, not_pid=job["pid"]), "the rerun's job to wait in its cell", second)
    second.send_signal(signal.SIGINT)
    text = _finish(second)
    assert second.returncode == 130, text
    assert f"its last job died without a result (pid {job['pid']}" in text and f"log {job['log']}" in text, text
    assert "Rerun the same command to resume" in text
    data = json.loads((out / "grid.json").read_text())
    assert data["not_complete"][0]["state"] == "missing" and "interrupted" in data["not_complete"][0]["why"]
    # a rerun whose command is killed leaves its job waiting: an orphan, named on the next rerun
    for p in hold.glob("started.*"):
        p.unlink()
    third = _popen(HELD, tmp_path, env)
    orphan = _wait(lambda: _held_job(hold, out), "the third run's job to wait in its cell", third)
    third.kill()
    third.wait(timeout=60)
    refused = satmon_cli(*HELD, cwd=tmp_path, env=env, timeout=120)
    assert refused.returncode == 3, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert f"got pid {orphan['pid']}" in refused.stderr and f"log {orphan['log']}" in refused.stderr, refused.stderr
    os.kill(orphan["pid"], signal.SIGKILL)
    # the last rerun completes the cell; nothing is left marked as running
    (hold / "release").write_text("")
    done = satmon_cli(*HELD, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"its last job died without a result (pid {orphan['pid']}" in done.stdout
    data = json.loads((out / "grid.json").read_text())
    assert data["counts"] == {"cells": 1, "done": 1, "missing": 0, "failed": 0, "diverged": 0}
    assert not list((out / "cells").glob("*.attempt.json")) and not list((out / "cells").glob("*.failed.json"))


_HOSTILE = {
    "satmon/__init__.py",
    "submitit/__init__.py",
    "torch/__init__.py",
    "numpy/__init__.py",
    "pickle.py",
    "lib/submitit/__init__.py",
}


@pytest.mark.parametrize("executor", ["submitit", "plain"])
def test_jobs_import_what_the_grid_imported_from_a_hostile_folder(tmp_path, executor):
    """The working folder holds packages named like satmon, submitit, torch and numpy, a pickle.py, and a relative
    PYTHONPATH entry holding another submitit: each writes a marker if imported. Neither the grid nor a job imports
    any of them, with submitit's local executor or plain processes; the job checked it imported the grid's satmon."""
    _, env = _held_folder(tmp_path)
    for rel in _HOSTILE:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"open({str(tmp_path / 'RAN')!r} + '_' + {rel.replace('/', '_')!r}, 'w').close()\n")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), "lib"] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("SATMON_TEST_HOLD")
    hide = "del sys.path[0]; sys.modules['submitit'] = None;"  # the plain-process executor
    cli = CLI if executor == "submitit" else [CLI[0], "-c", CLI[2].replace("del sys.path[0];", hide)]
    proc = subprocess.run(cli + HELD, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("plain local processes" in proc.stdout) == (executor == "plain")
    assert not list(tmp_path.glob("RAN_*")), sorted(p.name for p in tmp_path.glob("RAN_*"))
    data = json.loads((tmp_path / "g" / "grid.json").read_text())
    assert data["counts"]["done"] == 1


def test_help_says_what_a_job_imports():
    from satmon.cli.grid import DESCRIPTION, EPILOG

    text = " ".join((DESCRIPTION + EPILOG).split())
    assert "the working directory is not searched" in text and "jobs import what this command imported" in text
    assert "3 --out is in use" in text


def test_an_edited_recipe_file_trains_no_cell_under_the_first_key(tmp_path):
    """Two cells, one job at a time: the recipe file is edited while the first cell's job waits. Both cells are
    trained by the file as the grid keyed it (its copy under jobs/recipes), and the edited file makes new keys."""
    hold, env = _held_folder(tmp_path)
    original = (tmp_path / "held.py").read_bytes()
    args = HELD + ["--seeds", "0,1"]
    grid = _popen(args, tmp_path, env)
    _wait(lambda: _held_job(hold, tmp_path / "g"), "the first job to wait in its cell", grid)
    (tmp_path / "held.py").write_text(original.decode().replace('MARK = "first"', 'MARK = "edited"'))
    (hold / "release").write_text("")
    text = _finish(grid)
    assert grid.returncode == 0, text
    cells = json.loads((tmp_path / "g" / "grid.json").read_text())["cells"]
    sha = hashlib.sha256(original).hexdigest()
    assert [c["mark"] for c in cells] == ["first", "first"]
    assert {c["recipe"]["source_sha256"] for c in cells} == {sha}
    assert (tmp_path / "g" / "jobs" / "recipes" / sha[:16] / "held.py").read_bytes() == original
    again = satmon_cli(*args, "--executor", "slurm", "--dry-run", cwd=tmp_path, env=env, timeout=120)
    assert again.returncode == 0 and "2 cells (0 complete), 2 to run" in again.stdout, again.stdout + again.stderr


def test_a_job_refuses_code_other_than_its_key_names(tmp_path, monkeypatch):
    """MODULE:ATTR (no copy is made): a job whose module changed since the grid keyed it refuses to train."""
    from satmon.grid.recipe import (
        check_identity,
        load_recipe,
        recipe_identity,
        snapshot_recipe,
    )

    (tmp_path / "heldmod.py").write_bytes((HERE / "held_recipe.py").read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe, where = load_recipe("heldmod:RECIPE")
    identity = recipe_identity(recipe, where)
    assert snapshot_recipe(where, identity, tmp_path / "copies") == where and not (tmp_path / "copies").exists()
    check_identity(recipe, identity)
    with pytest.raises(ValueError, match="source_sha256.*changed after the grid started"):
        check_identity(recipe, {**identity, "source_sha256": "0" * 64})
    with pytest.raises(ValueError, match="version"):
        check_identity(recipe, {**identity, "version": "2"})
    builtin, spec = load_recipe("builtin")  # the builtin's key is unchanged: its identity is as before
    assert snapshot_recipe(spec, recipe_identity(builtin, spec), tmp_path / "c") == "satmon.grid.builtin:RECIPE"


def test_a_diverged_arm_is_an_outcome_and_the_grid_completes(tmp_path):
    """The DyT arm's loss NaN from step 2 in one --vary configuration: the grid completes (exit 0), grid.json and
    the report name and count the diverged arm, and a rerun finds both cells complete."""
    _, env = _held_folder(tmp_path)
    env.pop("SATMON_TEST_HOLD")
    args = HELD + ["--vary", "nan_at=0,2"]
    proc = satmon_cli(*args, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "g" / "grid.json").read_text())
    assert data["counts"] == {"cells": 2, "done": 2, "missing": 0, "failed": 0, "diverged": 1}
    cell = next(c for c in data["cells"] if c["vary"] == {"nan_at": 2})
    assert cell["diverged"] == {"dyt": 2} and cell["delta"] is None and cell["helps"] is False
    assert cell["arms"]["dyt"]["diverged_at"] == 2 and cell["arms"]["layernorm"]["diverged_at"] is None
    assert "the dyt arm diverged at step 2" in cell["missing"]["delta"]
    assert data["analysis"]["diverged"] == {"dyt": 1} and data["analysis"]["n"] == 2
    assert "dyt diverged at step 2" in (tmp_path / "g" / "report.md").read_text()
    assert "dyt diverged in 1/1" in proc.stdout and "diverged in 1 of 2 cells" in proc.stdout
    rerun = satmon_cli(*args, cwd=tmp_path, env=env, timeout=300)
    assert rerun.returncode == 0 and "2 cells (2 complete), 0 to run" in rerun.stdout, rerun.stderr[-2000:]


def _cell(name: str, delta, diverged=None, helps=None, group="s", seed=0, reading=0.5) -> dict:
    from satmon.grid.analysis import READINGS

    c = {
        "name": name,
        "group": group,
        "seed": seed,
        "budget": "100",
        "epochs": 1.0,
        "params": 10,
        "train_tokens": 100,
        "tokens_per_param": 10.0,
        "delta": delta,
        "delta_best": delta,
        "helps": helps if diverged else delta < 0,
        "diverged": diverged or {},
        "val_loss_layernorm": None if "layernorm" in (diverged or {}) else 2.0,
        "val_loss_dyt": None if "dyt" in (diverged or {}) else 2.1,
        "cpu_seconds": 1.0,
        "window_saturation": reading,
        "learns_dyt": None,
        "learns_layernorm": None,
        "unigram_loss": None,
    }
    c.update({r: reading for r in READINGS if r not in c})
    return c


def test_every_reader_of_cells_takes_null_fields_and_counts_divergence():
    """Cells the issue does not name: the reference arm diverged, both arms diverged, a window reading null, on
    two sizes and two seeds (the permutation test runs): no reader fails, each outcome is counted once."""
    from satmon.grid.analysis import (
        analyze,
        answer_text,
        cell_line,
        effect_table,
        forecast_check,
        phase_rows,
        report_markdown,
    )

    cells = [
        _cell("a0", -0.1, seed=0, reading=0.7),
        _cell("a1", 0.1, seed=1, reading=0.2),
        _cell("b0", None, {"layernorm": 4}, helps=True, group="t", reading=0.8),
        _cell("b1", None, {"dyt": 3, "layernorm": 5}, helps=None, group="t", seed=1),
        {**_cell("b2", 0.2, group="t", seed=1, reading=0.1), "window_first_block": None},
    ]
    a = analyze(cells, permutations=20)
    assert a["n"] == 4 and a["helps"] == 2 and a["diverged"] == {"dyt": 1, "layernorm": 2}
    why = "the dyt arm diverged at step 3; the layernorm arm diverged at step 5"
    assert a["excluded"] == [{"name": "b1", "why": why}]
    assert a["readings"]["window_first_block"] == {"missing": True} and a["decision"]["predicts"] is not None
    text = report_markdown(a, cells) + answer_text("r", cells, a, forecast_check(cells, 100))
    assert "layernorm diverged at step 4" in text and "b1 (the dyt arm diverged" in text
    rows = {r["size"]: r for r in effect_table(cells)}
    assert rows["t"]["judged"] == 2 and rows["t"]["measured"] == 1
    assert rows["t"]["diverged"] == {"dyt": 1, "layernorm": 2}
    assert "layernorm diverged at step 4" in cell_line(cells[2])
    assert [r["delta"] for r in phase_rows(cells, "x")][2] is None
    assert analyze([cells[3]], permutations=5)["decision"]["predicts"] is None


def test_settings_that_cannot_work_are_refused_before_any_work(tmp_path, capsys):
    """Each refused in one line naming the setting and the value, exit 2, the --out folder never made."""
    from satmon.cli.main import main

    long = "1" + "0" * 240
    cases = [
        (["--vary", "alpha_init=nan"], "--vary alpha_init", "'nan'"),
        (["--vary", "lr=1e-3,inf"], "--vary lr", "'inf'"),
        (["--vary", "grad_clip=1e400"], "--vary grad_clip", "'1e400'"),
        (["--vary", "weight_decay=-nan"], "--vary weight_decay", "'-nan'"),
        (["--option", "emb_scale=-inf"], "--option emb_scale", "'-inf'"),
        (["--lr", "nan"], "--lr", "nan"),
        (["--arms", "layernorm"], "Expected at least one DyT arm", "layernorm, dyt), got layernorm"),
        (["--vary", f"chunk_bytes=2048,{long}"], "--vary chunk_bytes=", "241 characters"),
        (["--vary", f"eval_every=4,{long}"], "--vary eval_every=", "file names fit"),
    ]
    for i, (extra, *said) in enumerate(cases):
        out = tmp_path / f"g{i}"
        code = main(["grid", "builtin", "--smoke", "--out", str(out), *extra])
        err = capsys.readouterr().err
        assert code == 2, (extra, err)
        assert all(s in err for s in said), (extra, err)
        assert not out.exists(), extra
    code = main(["grid", "llama", "--smoke", "--out", str(tmp_path / "l"), "--arms", "rmsnorm,rmsnorm-gelu"])
    assert code == 2 and "add one, e.g. --arms rmsnorm,rmsnorm-gelu,dyt" in capsys.readouterr().err


def test_a_job_that_died_says_why_and_names_its_log_or_why_none(tmp_path):
    """A plain-process job that stops before its cell (it would import another satmon than the grid's) is reported
    by its log's error line; one SIGKILLed by its signal; a SLURM job out of memory without a log says why none."""
    from satmon.grid.jobs import LocalProcesses, died_why

    ex = LocalProcesses(tmp_path / "jobs", 2)
    base = {"recipe": "builtin", "settings": {}, "options": {}, "size": "d16L1", "budget": "2000", "seed": 0}
    tasks = [
        {**base, "name": n, **{k: str(tmp_path / f"{n}.{k}") for k in ("cell", "attempt", "failed", "progress")}}
        for n in ("other", "killed")
    ]
    tasks[0]["imports"] = {"satmon": str(tmp_path / "another_satmon")}
    tasks[1]["recipe"] = "no_such_module_for_this_test:RECIPE"
    other, killed = ex.submit(tasks)
    killed.job.send_signal(signal.SIGKILL)
    for h in (other, killed):
        h.job.wait(timeout=120)
    why = ex.died_why(other)
    assert "RuntimeError: Expected the job to import satmon from" in why and f"log {other.log}" in why, why
    assert "exited with code 1" in why
    why = ex.died_why(killed)
    assert why.startswith("killed by SIGKILL (out of memory, or killed from outside)") and f"log {killed.log}" in why
    slurm = died_why("SLURM job 7 state OUT_OF_MEMORY", None, "OUT_OF_MEMORY", None, "SLURM wrote none")
    assert slurm == (
        "out of memory (the scheduler killed it) (SLURM job 7 state OUT_OF_MEMORY); no log: SLURM wrote none"
    )
    assert "log None" not in died_why("", None, "", None, "the job could not name one")
    # submitit's controller failing before its job (it once imported a submitit/ from the working folder)
    from types import SimpleNamespace

    from satmon.grid.jobs import Handle, SubmititLocal

    job = SimpleNamespace(_process=SimpleNamespace(poll=lambda: 1), job_id="5", state="FINISHED")
    why = SubmititLocal.__new__(SubmititLocal).died_why(Handle("c", job, str(tmp_path / "5_0_log.err")))
    assert why == (
        "exited with code 1 (job 5 state FINISHED, exit code 1); no log: submitit's controller ended "
        "before it started the job (what it printed went to this grid's stderr, above)"
    ), why
