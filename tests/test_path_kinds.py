"""Not a regular file, and paths at the system's limits, for every reader satmon has (issue 36 classes 1 and 5).

One table of members (a FIFO, a socket, a device, links to each, a loop, a name over NAME_MAX, a path over PATH_MAX),
tried against each reader: ``satmon report``'s LOGDIR and the event files it finds, ``satmon calibrate``'s runs and
CSV inputs, a ``calibration.json``, ``satmon replay --data``. Each is named by its kind in one line, never opened.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from satmon.paths import kind_of

ROOT = Path(__file__).resolve().parents[1]

MEMBERS = {
    "fifo": "a FIFO (named pipe)",
    "socket": "a socket",
    "dev-zero-link": "a symlink to a character device (/dev/zero)",
    "fifo-link": "a symlink to a FIFO (named pipe)",
    "link-loop": "a symlink loop",
    "name-over-name-max": "over the file system's limit of",
    "path-over-path-max": "(PATH_MAX)",
}


@pytest.fixture
def make(tmp_path):
    """``make(member, name)``: the member at ``tmp_path/name`` (the long ones at a longer path), returned as a str."""
    sockets: list[socket.socket] = []

    def build(member: str, name: str) -> str:
        path = tmp_path / name
        if member == "fifo":
            os.mkfifo(path)
        elif member == "socket":
            sockets.append(socket.socket(socket.AF_UNIX))
            sockets[-1].bind(str(path))
        elif member == "dev-zero-link":
            path.symlink_to("/dev/zero")
        elif member == "fifo-link":
            os.mkfifo(tmp_path / f"real-{Path(name).name}")
            path.symlink_to(tmp_path / f"real-{Path(name).name}")
        elif member == "link-loop":
            path.symlink_to(path)
        elif member == "name-over-name-max":
            return str(tmp_path / ("n" * 300 + name))
        else:
            return str(tmp_path) + "/p" * 2100 + "/" + name
        return str(path)

    yield build
    for s in sockets:
        s.close()


def _said(message: str, member: str) -> None:
    assert MEMBERS[member] in message, message
    assert "Errno" not in message and "Traceback" not in message and "\n" not in message.strip(), message


@pytest.mark.parametrize("member", list(MEMBERS))
def test_kind_of_never_opens_and_names_each_member(make, member, monkeypatch):
    path = make(member, "x.pt")
    monkeypatch.setattr(os, "open", lambda *a, **k: pytest.fail("opened"))
    kind = kind_of(path)
    assert not kind.regular and MEMBERS[member] in kind.describe()


@pytest.mark.parametrize("member", list(MEMBERS))
def test_satmon_report_names_a_logdir_that_is_not_a_file_or_a_folder(make, member, capsys):
    from satmon.cli.main import main

    path = make(member, "events.out.tfevents.1.host")
    assert main(["report", path]) == 2
    _said(capsys.readouterr().err, member)


@pytest.mark.parametrize("member", ["fifo", "socket", "dev-zero-link", "fifo-link", "link-loop"])
def test_an_event_file_that_is_not_a_file_is_named_by_kind_in_a_folder(make, member, tmp_path):
    """In a process of its own under a timeout: a FIFO opened would block forever."""
    run = tmp_path / "run"
    run.mkdir()
    make(member, "run/events.out.tfevents.2.odd")
    code = f"from satmon.io.tensorboard_reader import read_run; import sys; print(read_run({str(run)!r}).problems)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "not a regular file: " + MEMBERS[member].split(" (/dev")[0] in done.stdout, done.stdout


@pytest.mark.parametrize("member", list(MEMBERS))
def test_calibrate_inputs_are_named_by_kind(make, member):
    from satmon.calibrate.fit import CalibrationError, read_text
    from satmon.calibrate.runs import run_readings
    from satmon.results.calibration import load_calibration

    for call in (lambda p: run_readings([p]), lambda p: read_text(p, "an outcomes CSV"), load_calibration):
        path = make(member, f"in{id(call)}.json")
        with pytest.raises(CalibrationError) as e:
            call(path)
        _said(str(e.value), member)


@pytest.mark.parametrize("member", list(MEMBERS))
def test_replay_data_is_named_by_kind(make, member):
    from satmon.replaying.data import check_data_file
    from satmon.replaying.user_code import ReplayUsageError

    with pytest.raises(ReplayUsageError) as e:
        check_data_file(make(member, "calib.pt"))
    _said(str(e.value), member)


@pytest.fixture
def replay_folder(tmp_path, monkeypatch):
    import torch

    (tmp_path / "m.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))\n"
    )
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).state_dict(), tmp_path / "w.pt")
    torch.save(torch.randn(8, 4), tmp_path / "calib.pt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("too_long", ["name", "path"])
@pytest.mark.parametrize("option", ["CHECKPOINT", "--data", "--json", "--report", "--logdir", "--name", "--live"])
def test_every_replay_path_over_the_system_limits_is_one_line_exit_2(replay_folder, capsys, option, too_long):
    """issue 36 class 5: never 'stopped by OSError: [Errno 36] File name too long'."""
    from satmon.cli.main import main

    suffix = {"--json": ".json", "--report": ".md", "--data": ".pt", "CHECKPOINT": ".pt"}.get(option, "")
    value = ("x" * 300 + suffix) if too_long == "name" else (str(replay_folder) + "/a" * 2100 + "/w" + suffix)
    if option == "--name" and too_long == "path":
        value = "/".join(["n" * 200] * 22)  # a relative run name over PATH_MAX
    argv = dict.fromkeys(["CHECKPOINT", "--factory", "--data"])
    argv.update({"CHECKPOINT": "w.pt", "--factory": "./m.py:build", "--data": "calib.pt"})
    argv[option] = value
    cmd = [
        "replay",
        argv.pop("CHECKPOINT"),
        *[x for kv in argv.items() for x in kv],
        "--quiet",
        "--no-twin",
        *([] if option == "--logdir" else ["--logdir", str(replay_folder / "tb")]),
    ]
    assert main(cmd) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Errno" not in err and "limit" in err, err
    assert not (replay_folder / "tb").exists()  # refused before any work


@pytest.mark.parametrize("member", ["fifo", "socket", "dev-zero-link", "fifo-link", "link-loop"])
@pytest.mark.parametrize("option", ["--logdir", "--json", "--report", "--data", "--live", "--factory"])
def test_every_replay_path_that_is_not_a_file_is_named_by_kind_exit_2(replay_folder, make, capsys, option, member):
    """issue 36 class 1 through the CLI: each output and input option, each member, one line naming the kind."""
    from satmon.cli.main import main

    path = make(
        member, "odd" + {"--json": ".json", "--report": ".md", "--data": ".pt", "--factory": ".py"}.get(option, "")
    )
    if option == "--factory":
        path += ":build"
    argv = {"--factory": "./m.py:build", "--data": "calib.pt", "--logdir": str(replay_folder / "tb"), option: path}
    assert main(["replay", "w.pt", *[x for kv in argv.items() for x in kv], "--quiet", "--no-twin"]) == 2
    err = capsys.readouterr().err.strip()
    phrase = MEMBERS[member].split(" (/dev")[0]
    assert len(err.splitlines()) == 1 and phrase in err and "Errno" not in err, err
    assert not (replay_folder / "tb").exists() or option == "--logdir"
