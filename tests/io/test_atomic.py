"""Outputs are replaced only by complete files; blocked outputs are found before any work."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from satmon.io.atomic import OutputError, atomic_open, atomic_write, check_output


def test_an_exception_mid_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "prev.json"
    target.write_text("60 complete records")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(target) as f:
            f.write("3 records")
            raise KeyboardInterrupt
    assert target.read_text() == "60 complete records"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prev.json"]


def test_a_killed_writer_leaves_the_previous_file(tmp_path):
    target = tmp_path / "prev.json"
    target.write_text("before")
    script = textwrap.dedent(f"""
        import os, signal
        from satmon.io.atomic import atomic_open
        with atomic_open({str(target)!r}) as f:
            f.write("partial")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert out.returncode == -signal.SIGKILL
    assert target.read_text() == "before"


def test_overwriting_keeps_the_permission_bits(tmp_path):
    target = tmp_path / "r.md"
    target.write_text("old")
    os.chmod(target, 0o640)
    assert atomic_write(target, "new") is True
    assert target.read_text() == "new" and stat.S_IMODE(os.stat(target).st_mode) == 0o640


def test_a_new_file_gets_the_umask_default(tmp_path):
    umask = os.umask(0o022)
    try:
        assert atomic_write(tmp_path / "n.txt", b"x") is False
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "n.txt").st_mode) == 0o644


@pytest.mark.parametrize(
    ("make", "name", "suffixes", "match"),
    [
        (None, "", (), "empty name"),
        (None, "  ", (), "empty name"),
        ("dir", "out.json", (".json",), "a folder"),
        (None, "x.txt", (".md",), r"end in \.md"),
        ("file-parent", "f/out.json", (), "got a file at"),
        ("readonly-file", "ro.json", (), "read-only file"),
        ("readonly-dir", "rod/out.json", (), "cannot write to"),
    ],
)
def test_blocked_outputs_are_named_before_any_work(tmp_path, make, name, suffixes, match):
    path = tmp_path / name if name.strip() else name
    if make == "dir":
        path.mkdir()
    elif make == "file-parent":
        (tmp_path / "f").write_text("a file")
    elif make == "readonly-file":
        path.write_text("kept")
        os.chmod(path, 0o444)
    elif make == "readonly-dir":
        (tmp_path / "rod").mkdir()
        os.chmod(tmp_path / "rod", 0o555)
    with pytest.raises(OutputError, match=match):
        check_output(path, "--json", suffixes)
    if make == "readonly-file":
        assert path.read_text() == "kept"


def test_a_missing_folder_is_fine_it_is_made_at_write_time(tmp_path):
    p = check_output(tmp_path / "a" / "b" / "out.json", "--json", (".json",))
    assert atomic_write(p, "{}") is False and p.read_text() == "{}"
