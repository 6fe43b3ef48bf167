"""The DDP tests' launcher (``helpers.run_ranks``): a run that hangs fails its test with where every process of it
hung (each thread's Python stack), and leaves no process behind."""

from __future__ import annotations

import sys
import textwrap

import pytest

from helpers import run_ranks

HANG = textwrap.dedent(
    """
    import subprocess, sys, time

    CHILD = "import time\\ndef a_rank_waiting_for_the_other():\\n    time.sleep(600)\\na_rank_waiting_for_the_other()"


    def a_launcher_waiting_for_its_ranks(child):
        child.wait()


    child = subprocess.Popen([sys.executable, "-c", CHILD])
    with open("child.pid", "w") as f:
        f.write(str(child.pid))
    time.sleep(0.5)
    print("started", flush=True)
    a_launcher_waiting_for_its_ranks(child)
    """
)


def test_a_hung_run_fails_with_where_each_process_hung_and_leaves_none(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    with pytest.raises(AssertionError) as failed:
        run_ranks([sys.executable, str(script)], cwd=tmp_path, timeout=10)
    message = str(failed.value)
    assert "finish within 10 s" in message and "started" in message
    assert "a_launcher_waiting_for_its_ranks" in message  # the launcher's stack
    assert "a_rank_waiting_for_the_other" in message  # and the rank's
    child = int((tmp_path / "child.pid").read_text())
    assert not _running(child)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (an exited one not yet reaped by its new parent is a zombie: not live)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
