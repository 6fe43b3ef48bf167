"""One writer per output: a second process is refused while the first holds the output, a killed holder's lock is
taken over and named as stale, and the lock's companion file is never a FIFO or a link."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from satmon.io.atomic import OutputError
from satmon.io.lock import OutputBusy, exclusive, lock_path

HOLD = textwrap.dedent("""
    import sys, time
    from satmon.io.lock import exclusive
    with exclusive(sys.argv[1], "--json", folder=False):
        print("held", flush=True)
        time.sleep(60)
""")


def _holder(out: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_writer_refused_with_the_holder_named_then_free(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = _holder(out)
    try:
        with pytest.raises(OutputBusy) as e:
            with exclusive(out, "--json", folder=False):
                pass
        assert f"pid {p.pid}" in str(e.value) and "--json" in str(e.value) and "another output" in str(e.value)
        assert e.value.holder["pid"] == p.pid
    finally:
        p.terminate()
        p.wait(10)
    # SIGTERM ends the holder without its cleanup: the lock file stays, and is stale
    assert lock_path(out, folder=False).exists()
    with exclusive(out, "--json", folder=False) as held:
        assert held.stale is not None and held.stale["pid"] == p.pid
        assert str(p.pid) in held.note()
    assert not lock_path(out, folder=False).exists()


def test_killed_holder_is_stale(tmp_path: Path) -> None:
    out = tmp_path / "grid"
    out.mkdir()
    code = HOLD.replace("folder=False", "folder=True")
    p = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    with exclusive(out, "the grid folder --out", folder=True) as held:
        assert held.stale["pid"] == p.pid


def test_same_process_twice_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with exclusive(out, "--json", folder=False):
        with pytest.raises(OutputBusy, match="in use by pid"):
            with exclusive(out, "--json", folder=False):
                pass


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_companion_not_a_regular_file_is_refused_by_kind(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "r.json"
    lp = lock_path(out, folder=False)
    target = tmp_path / "elsewhere"
    if kind == "fifo":
        os.mkfifo(lp)
    else:
        target.write_text("mine")
        lp.symlink_to(target)
    t0 = time.perf_counter()
    with pytest.raises(OutputError, match="a FIFO" if kind == "fifo" else "a symbolic link"):
        with exclusive(out, "--json", folder=False):
            pass
    assert time.perf_counter() - t0 < 5  # never blocked on opening a FIFO
    if kind == "symlink":
        assert target.read_text() == "mine"
