"""The output classes, for every command and every output (issue 48 section 2).

- **One writer per output, every writer**: while another live process holds an output (``calibration.json``, a
  ``--plot``, ``satmon report``'s ``--plot-file``, a replay's ``--json`` and ``--report``, a grid's ``--out``), a
  command told to write it is refused in one line naming that process, and nothing it would write is touched; two
  ``satmon calibrate`` into one ``--out`` at once leave both files from one run.
- **Paths at their limits, counting what satmon writes beneath them**: an output folder or file whose own path fits
  PATH_MAX but whose deepest written file (an event file under ``version_N``, a checkpoint, a grid cell's
  temporary, a lock) would not is refused before any work, in one line naming the option, the length, the limit and
  what to do, exit 2, with nothing created and no argparse usage block.
- **Named by kind**: what sits where an output goes (a socket, a FIFO, a device, a dangling symlink, a symlink
  loop) is named by its kind, never "a file", for each command's output paths and the locks beside them.

Every holder is a real other process (``flock`` conflicts between processes), held in place on a pipe: nothing
here depends on timing.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from satmon.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
CELLS = "name,saturation,delta,group\na,0.6,-0.1,small\nb,0.2,0.1,small\nc,0.7,-0.2,big\nd,0.3,0.2,big\n"
CELLS_6 = CELLS + "e,0.65,-0.05,big\nf,0.25,0.05,small\n"
GRID = [
    "grid",
    "builtin",
    "--smoke",
    "--sizes",
    "d16L1",
    "--budgets",
    "2000",
    "--seeds",
    "0",
    "--steps",
    "8",
    "--window",
    "4",
    "--warmup",
    "0",
]


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A folder with a cells file, a tiny model's weights and calibration batches, a cells JSON for the report."""
    import torch

    (tmp_path / "cells.csv").write_text(CELLS)
    (tmp_path / "cells6.csv").write_text(CELLS_6)
    (tmp_path / "m.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))\n"
    )
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).state_dict(), tmp_path / "w.pt")
    torch.save(torch.randn(8, 4), tmp_path / "calib.pt")
    (tmp_path / "grid_cells.json").write_text(json.dumps({"recipe": {"name": "mine"}, "cells": []}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


REPLAY = ["replay", "w.pt", "--factory", "./m.py:build", "--data", "calib.pt", "--quiet", "--no-twin"]

#: output -> (the command, the path another process holds, whether it is a folder's lock, the exit code of a refusal)
HELD = {
    "calibrate --out's calibration.json": (
        ["calibrate", "--cells", "cells.csv", "--out", "o"],
        "o/calibration.json",
        False,
        2,
    ),
    "calibrate --plot": (["calibrate", "--cells", "cells.csv", "--out", "o", "--plot", "p.svg"], "p.svg", False, 2),
    "report --plot-file": (["report", "--cells", "grid_cells.json", "--plot-file", "phase.png"], "phase.png", False, 2),
    "replay --json": ([*REPLAY, "--logdir", "tb", "--json", "r.json"], "r.json", False, 2),
    "replay --report": ([*REPLAY, "--logdir", "tb", "--report", "r.md"], "r.md", False, 2),
    "grid --out": ([*GRID, "--out", "g"], "g", True, 3),
}


class Holder:
    """Another process holding an output's one-writer lock until :meth:`release` (it waits on its stdin)."""

    def __init__(self, path: Path, folder: bool) -> None:
        code = (
            "import sys\nfrom satmon.io.lock import exclusive\n"
            f"with exclusive({str(path)!r}, 'the test', folder={folder}):\n"
            "    print('held', flush=True)\n    sys.stdin.read()\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV
        )
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        self.proc.communicate("", timeout=60)


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[p.relative_to(root).as_posix()] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "usage:" not in err, err
    return lines[0]


@pytest.mark.parametrize("output", list(HELD))
def test_an_output_another_process_writes_is_refused_naming_it_and_nothing_is_written(work, output, capsys):
    argv, held, folder, code = HELD[output]
    if folder:
        (work / held).mkdir()
    else:
        (work / held).parent.mkdir(parents=True, exist_ok=True)
    holder = Holder(work / held, folder)
    try:
        before = _tree(work)
        assert main(argv) == code
        line = _one_line(capsys.readouterr().err)
        assert f"in use by pid {holder.proc.pid}" in line and "wait for that process to finish" in line, line
        after = _tree(work)
    finally:
        holder.release()
    assert after == before  # no output, no TensorBoard run, no temporary, no folder


def test_two_calibrates_into_one_out_at_once_leave_both_files_from_one_run(work, monkeypatch, capsys):
    """The first holds its outputs between writing calibration.json and the plot; a second process told the same --out
    (other cells) is refused there, naming the first, and both files are the first's."""
    from satmon.cli import calibrate

    real_plot, seen = calibrate.plot, {}

    def plot_after_a_second_writer(result, path):
        seen["second"] = subprocess.run(
            [
                sys.executable,
                "-m",
                "satmon.cli.main",
                "calibrate",
                "--cells",
                "cells6.csv",
                "--out",
                "o",
                "--plot",
                "o/calibration.svg",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=ENV,
            check=False,
        )
        return real_plot(result, path)

    monkeypatch.setattr(calibrate, "plot", plot_after_a_second_writer)
    assert main(["calibrate", "--cells", "cells.csv", "--out", "o", "--plot", "o/calibration.svg"]) == 0
    second = seen["second"]
    assert second.returncode == 2 and second.stdout == "", second
    line = _one_line(second.stderr)
    assert f"in use by pid {os.getpid()}" in line and "nothing was written" in line, line
    cal = json.loads((work / "o" / "calibration.json").read_text())
    assert "cells.csv" in json.dumps(cal) and "cells6.csv" not in json.dumps(cal)
    assert "4 cells" in (work / "o" / "calibration.svg").read_text()  # the plot's title: the first run's 4, not 6
    assert sorted(p.name for p in (work / "o").iterdir()) == ["calibration.json", "calibration.svg"]  # locks removed


def test_a_lock_that_cannot_be_made_says_why_first_and_never_cuts_the_reason(tmp_path):
    """A lock whose path is over PATH_MAX (the grid's folder at 4,085 bytes gave 'Expected to take the lock /...ddd'
    cut before the reason): the reason and what to do fit in the line, the path is shortened in its middle."""
    from satmon.errors import error_line
    from satmon.io.atomic import OutputError
    from satmon.io.lock import exclusive

    deep = str(tmp_path) + ("/" + "d" * 200) * 21
    with pytest.raises(OutputError) as e, exclusive(deep, "the grid folder --out", folder=True):
        pass
    line = error_line(e.value)
    assert "File name too long" in line and line.endswith("pass a shorter output path, or one nearer /."), line
    assert len(line) < 400 and "..." in line


# ------------------------------------------------------------------------------------------ paths at their limits
def _deep(root: Path, length: int, suffix: str = "") -> str:
    """An absolute path of exactly ``length`` bytes under ``root`` (names of 200 bytes), ending in ``suffix``."""
    path = str(root)
    while len(path) < length - 210:
        path += "/" + "d" * 200
    return path + "/" + "e" * (length - len(path) - 1 - len(suffix)) + suffix


#: (command, option, argv with {} for the path, the suffix the path ends in)
LIMITS = [
    ("demo", "--logdir", ["demo", "--logdir", "{}"], ""),
    ("replay", "--logdir", [*REPLAY, "--logdir", "{}", "--name", "n"], ""),
    ("replay", "--json", [*REPLAY, "--logdir", "tb", "--json", "{}"], ".json"),
    ("replay", "--report", [*REPLAY, "--logdir", "tb", "--report", "{}"], ".md"),
    ("calibrate", "--out", ["calibrate", "--cells", "cells.csv", "--out", "{}"], ""),
    ("calibrate", "--plot", ["calibrate", "--cells", "cells.csv", "--out", "o", "--plot", "{}"], ".png"),
    ("report", "--plot-file", ["report", "--cells", "grid_cells.json", "--plot-file", "{}"], ".png"),
    ("grid", "--out", [*GRID, "--out", "{}"], ""),
]


#: every output at 4,084 and 4,095 bytes (its lock alone needs 13 more); the folders whose deepest file is a run's event
#: file, a checkpoint or a grid cell's temporary also at 4,052 and 4,070 (the replay's failing range)
SIZES = [
    (*case, n)
    for case in LIMITS
    for n in (
        (4052, 4070, 4084, 4095)
        if case[0] in ("demo", "replay", "grid") and case[1] in ("--logdir", "--out")
        else (4084, 4095)
    )
]


@pytest.mark.parametrize(
    ("command", "option", "argv", "suffix", "length"), SIZES, ids=[f"{c}-{o}-{n}" for c, o, _, _, n in SIZES]
)
def test_an_output_with_no_room_beneath_is_refused_before_any_work_in_one_line(
    work, capsys, monkeypatch, command, option, argv, suffix, length
):
    """The path itself fits PATH_MAX (4,096); what satmon writes beneath or beside it would not."""
    from satmon.cli import demo

    monkeypatch.setattr(demo, "run_demo", lambda *_: pytest.fail("satmon demo trained before refusing its --logdir"))
    path = _deep(work / "deep", length, suffix)
    assert len(os.fsencode(path)) == length < os.pathconf(work, "PC_PATH_MAX")
    before = _tree(work)
    code = main([a.replace("{}", path) for a in argv])
    line = _one_line(capsys.readouterr().err)
    assert code == 2, line
    assert line.startswith(f"satmon {command}: Expected {option} ") and "(PATH_MAX)" in line, line
    assert re.search(r"of at most [\d,]+ bytes", line) and re.search(r"4,0\d\d bytes", line), line
    assert "Errno" not in line and "usage" not in line
    assert _tree(work) == before  # nothing created: not the folder, not a lock, not a run


@pytest.mark.parametrize(
    ("argv", "todo"),
    [
        (["calibrate", "--cells", "cells.csv", "--out", "o", "--plot", "p" * 240 + ".svg"], "--plot"),  # its temporary
        # its lock and temporary
        (
            ["report", "--cells", "grid_cells.json", "--plot-file", "p" * 245 + ".png"],
            "--plot-file",
        ),
        # a cell's files
        (
            [*GRID, "--vary", "chunk_bytes=2048,1" + "0" * 240, "--out", "g"],
            "pass a shorter --vary value",
        ),
    ],
    ids=["calibrate-plot", "report-plot-file", "grid-vary"],
)
def test_a_name_satmon_makes_beside_or_beneath_an_output_over_name_max_is_refused(work, capsys, argv, todo):
    before = _tree(work)
    code = main(argv)
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and todo in line and "255" in line, line
    assert _tree(work) == before


def test_a_long_run_name_whose_files_fit_is_not_refused(work, capsys):
    """A 250-byte --name: version_N and the event file beneath it are names of their own, each within NAME_MAX."""
    assert main([*REPLAY, "--logdir", "tb", "--name", "n" * 250]) == 0, capsys.readouterr().err
    assert (work / "tb" / ("n" * 250) / "version_0").is_dir()


def test_the_room_counted_is_what_the_writers_make(tmp_path):
    """check_room is told each writer's deepest file: the replay's event file under version_N, the demo's checkpoint,
    a file's temporary and lock; a path that leaves exactly room for them passes and writes them."""
    from satmon.paths import beside, check_room, event_file

    name = os.path.basename(event_file("x"))
    assert name.startswith("events.out.tfevents.") and socket.gethostname() in name
    assert [os.path.basename(p) for p in beside("a/r.json")] == [".r.json.XXXXXXXX.tmp", ".r.json.satmon-lock"]
    limit = os.pathconf(tmp_path, "PC_PATH_MAX")
    beneath = "version_9999/" + name
    fits = _deep(tmp_path, limit - 2 - len(beneath))
    check_room("--logdir", fits, [os.path.join(fits, beneath)])  # the deepest path is PATH_MAX - 1 bytes: it fits
    over = fits + "e"
    with pytest.raises(
        ValueError, match=rf"deepest file \(version_9999/events.out.tfevents.* would be {limit:,} bytes"
    ):
        check_room("--logdir", over, [os.path.join(over, beneath)])


# ------------------------------------------------------------------------------------------ named by kind
def _member(kind: str, path: Path, keep: list) -> None:
    if kind == "socket":
        keep.append(socket.socket(socket.AF_UNIX))
        keep[-1].bind(str(path))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-null-link":
        path.symlink_to(os.devnull)
    elif kind == "dangling-link":
        path.symlink_to(path.parent / "gone")
    else:
        path.symlink_to(path)


PHRASES = {
    "socket": "a socket",
    "fifo": "a FIFO (named pipe)",
    "dev-null-link": "a symlink to a character device",
    "dangling-link": "a broken symlink",
    "link-loop": "a symlink loop",
}
LOCK_PHRASES = {
    "socket": "a socket",
    "fifo": "a FIFO (named pipe)",
    "dev-null-link": "a symbolic link",
    "dangling-link": "a symbolic link",
    "link-loop": "a symbolic link",
}

#: where the member goes -> the command that writes there (the run folder, an output, a folder above one, a lock)
PLACES = {
    "replay LOGDIR/NAME": ("tb/n", [*REPLAY, "--logdir", "tb", "--name", "n"]),
    "replay above --json": ("up", [*REPLAY, "--logdir", "tb", "--json", "up/r.json"]),
    "demo LOGDIR/demo": ("lg/demo", ["demo", "--logdir", "lg"]),
    "demo LOGDIR/demo/version_0": ("lg/demo/version_0", ["demo", "--logdir", "lg"]),
    "calibrate --out": ("o", ["calibrate", "--cells", "cells.csv", "--out", "o"]),
    "calibrate above --out": ("up", ["calibrate", "--cells", "cells.csv", "--out", "up/o"]),
    "calibrate's calibration.json": ("o/calibration.json", ["calibrate", "--cells", "cells.csv", "--out", "o"]),
    "report --plot-file": ("phase.png", ["report", "--cells", "grid_cells.json", "--plot-file", "phase.png"]),
    "grid --out": ("g", [*GRID, "--out", "g"]),
    "calibrate's lock": ("o/.calibration.json.satmon-lock", ["calibrate", "--cells", "cells.csv", "--out", "o"]),
    "replay --json's lock": (".r.json.satmon-lock", [*REPLAY, "--logdir", "tb", "--json", "r.json"]),
}


@pytest.mark.parametrize("kind", list(PHRASES))
@pytest.mark.parametrize("place", list(PLACES))
def test_what_sits_where_an_output_goes_is_named_by_its_kind_never_a_file(work, capsys, monkeypatch, place, kind):
    from satmon.cli import demo

    monkeypatch.setattr(demo, "run_demo", lambda *_: pytest.fail("satmon demo trained before refusing its --logdir"))
    rel, argv = PLACES[place]
    if kind == "dangling-link" and place.startswith(("calibrate's calibration", "report --plot")):
        pytest.skip("an output through a link is written where the link points: a dangling one makes its target")
    path = work / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    keep: list = []
    _member(kind, path, keep)
    try:
        code = main(argv)
    finally:
        for s in keep:
            s.close()
    line = _one_line(capsys.readouterr().err)
    phrase = (LOCK_PHRASES if place.endswith("lock") else PHRASES)[kind]
    assert code == 2 and phrase in line, line
    assert not re.search(r"(is|got) a file\b|\(a file\)", line), line


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root opens a read-only lock file for writing: the fallback is not reached"
)
def test_a_lock_file_this_user_cannot_write_still_locks_and_names_its_holder(work, capsys):
    """Another user's lock file (here: read-only to this user) is locked through a read-only descriptor (flock needs no
    write access): a live holder is named, a killed one's stale lock is taken over."""
    (work / "o").mkdir()
    holder = Holder(work / "o" / "calibration.json", False)
    lock = work / "o" / ".calibration.json.satmon-lock"
    try:
        os.chmod(lock, 0o444)
        assert main(["calibrate", "--cells", "cells.csv", "--out", "o"]) == 2
        line = _one_line(capsys.readouterr().err)
        assert f"in use by pid {holder.proc.pid}" in line, line
    finally:
        holder.proc.kill()
        holder.proc.wait()
    assert lock.exists() and main(["calibrate", "--cells", "cells.csv", "--out", "o"]) == 0
    assert "took over a stale lock on o" in capsys.readouterr().err
    assert json.loads((work / "o" / "calibration.json").read_text())["threshold"] is not None


def test_a_demo_whose_version_another_demo_took_after_its_listing_writes_the_next(work, monkeypatch, capsys):
    """Lightning's logger lists ``version_N`` and makes it later: two demos started together could write one folder.
    The demo claims its folder with one ``mkdir``; here another demo made ``version_0`` after this one listed it."""
    from satmon.io import tensorboard_replay as tbr

    (work / "lg" / "demo" / "version_0").mkdir(parents=True)
    (work / "lg" / "demo" / "version_0" / "theirs").write_text("x")
    real, calls = tbr.next_version, []

    def listed_before_the_other_mkdir(root):
        calls.append(root)
        return 0 if len(calls) == 1 else real(root)

    monkeypatch.setattr(tbr, "next_version", listed_before_the_other_mkdir)
    assert (
        main(
            [
                "demo",
                "--window",
                "2",
                "--steps",
                "2",
                "--d-model",
                "8",
                "--layers",
                "1",
                "--batch-size",
                "2",
                "--seq-len",
                "8",
                "--train-tokens",
                "100",
                "--checkpoint-every",
                "0",
                "--threads",
                "1",
                "--quiet",
                "--logdir",
                "lg",
            ]
        )
        == 0
    )
    assert os.listdir(work / "lg" / "demo" / "version_0") == ["theirs"]  # the other run's folder, untouched
    assert (work / "lg" / "demo" / "version_1" / "checkpoints" / "epoch=0-step=2.ckpt").is_file()
    assert "lg/demo/version_1" in capsys.readouterr().out and len(calls) == 2
