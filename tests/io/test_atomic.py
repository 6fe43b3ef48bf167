"""Outputs are replaced only by complete files; blocked outputs are found before any work."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from satmon.io.atomic import OutputError, atomic_open, atomic_write, check_output, check_output_dir


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
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, check=False)
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


def test_a_name_ending_in_a_separator_or_a_device_is_refused(tmp_path):
    with pytest.raises(OutputError, match="a folder"):
        check_output(f"{tmp_path}/new.json/", "--json", (".json",))
    with pytest.raises(OutputError, match="which is a character device: choose another path"):
        check_output(os.devnull, "--json")
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match=r"which is a FIFO \(named pipe\): choose another path"):
        check_output(fifo, "--json", (".json",))


@pytest.mark.parametrize("member", ["fifo", "socket", "dev-null-link", "fifo-link", "link-loop"])
@pytest.mark.parametrize("output", ["file", "folder"])
def test_an_output_that_is_not_a_regular_file_is_refused_by_kind_never_opened(tmp_path, member, output):
    """issue 36 class 1: --json/--report (a file) and --out (a grid's folder) at a FIFO, a socket, a device, a link."""
    import socket

    path = tmp_path / "out.json"
    keep = []
    if member == "fifo":
        os.mkfifo(path)
    elif member == "socket":
        keep.append(socket.socket(socket.AF_UNIX))
        keep[0].bind(str(path))
    elif member == "dev-null-link":
        path.symlink_to(os.devnull)
    elif member == "fifo-link":
        os.mkfifo(tmp_path / "real")
        path.symlink_to(tmp_path / "real")
    else:
        path.symlink_to(path)
    phrase = {
        "fifo": "a FIFO",
        "socket": "a socket",
        "dev-null-link": "a symlink to a character device",
        "fifo-link": "a symlink to a FIFO",
        "link-loop": "a symlink loop",
    }[member]
    check = (
        (lambda: check_output(path, "--json", (".json",)))
        if output == "file"
        else (lambda: check_output_dir(path, "--out"))
    )
    with pytest.raises(OutputError, match=phrase):
        check()
    for s in keep:
        s.close()


def test_suffixes_compare_case_insensitively(tmp_path):
    assert check_output(tmp_path / "R.MD", "--report", (".md",)) == tmp_path / "R.MD"


def test_a_symlinked_output_is_written_where_it_points_and_the_link_stays(tmp_path):
    real = tmp_path / "store" / "r.json"
    real.parent.mkdir()
    real.write_text("old")
    os.chmod(real, 0o600)
    link = tmp_path / "r.json"
    link.symlink_to(real)
    assert check_output(link, "--json", (".json",)) == link
    assert atomic_write(link, "new") is True
    assert link.is_symlink() and real.read_text() == "new" and stat.S_IMODE(os.stat(real).st_mode) == 0o600
    assert sorted(p.name for p in real.parent.iterdir()) == ["r.json"]


@pytest.mark.parametrize(
    ("make", "name", "match"),
    [
        (None, "", "empty name"),
        ("file", "f", r"got '.*f' \(a file\)"),
        ("file", "f/sub", "got a file at"),
        ("readonly-dir", "rod/new", "cannot write to"),
        ("readonly-dir", "rod", "cannot write to"),
    ],
)
def test_blocked_output_folders_are_named_before_any_work(tmp_path, make, name, match):
    if make == "file":
        (tmp_path / "f").write_text("kept")
    elif make == "readonly-dir":
        (tmp_path / "rod").mkdir()
        os.chmod(tmp_path / "rod", 0o555)
    with pytest.raises(OutputError, match=match):
        check_output_dir(tmp_path / name if name else name, "--out")
    assert not (tmp_path / "rod" / "new").exists()
    if make == "file":
        assert (tmp_path / "f").read_text() == "kept"


def test_an_output_folder_that_exists_or_can_be_made_passes_and_is_not_made(tmp_path):
    assert check_output_dir(tmp_path, "--out") == tmp_path
    assert check_output_dir(tmp_path / "a" / "b", "--out") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checked, not created: a refused command leaves nothing behind


# --- the writers: an interrupt or a kill during the write leaves the previous output as it was --------------
def _interrupt_at_fsync(monkeypatch):
    from satmon.io import atomic

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "fsync", interrupted)


def _records(n: int) -> list[dict]:
    return [{"checkpoint": f"step={i}.ckpt", "global_step": i, "saturation": 0.5} for i in range(n)]


@pytest.mark.parametrize("name", ["prev.json", "prev.jsonl"])
def test_records_survive_a_keyboard_interrupt_during_the_rewrite(tmp_path, monkeypatch, name):
    from satmon.io.json_records import write_records

    target = write_records(tmp_path / name, _records(60))
    before = target.read_bytes()
    _interrupt_at_fsync(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        write_records(target, _records(3))
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_records_survive_a_sigkill_during_the_rewrite(tmp_path):
    from satmon.io.json_records import write_records

    target = write_records(tmp_path / "prev.json", _records(60))
    before = target.read_bytes()
    script = textwrap.dedent(f"""
        import os, signal
        from satmon.io import atomic
        from satmon.io.json_records import write_records
        atomic.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        write_records({str(target)!r}, [{{"global_step": 1}}] * 3)
    """)
    assert (
        subprocess.run([sys.executable, "-c", script], capture_output=True, check=False).returncode == -signal.SIGKILL
    )
    assert target.read_bytes() == before


def test_a_report_and_its_plots_survive_an_interrupt(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from satmon.io.markdown import report_paths, write_report

    files = report_paths(tmp_path / "replay.md")
    for i, f in enumerate(files):
        f.write_bytes(f"previous {i}".encode())
    records = [{"global_step": s, "layers": {"ln": {"saturation": v}}} for s, v in ((2, 0.3), (4, 0.6))]
    rows = [
        {
            "saturation": v,
            "step": r["global_step"],
            "name": f"s{r['global_step']}",
            "decision": "go",
            "margin": 0.1,
            "norm_type": "dyt",
            "min_ratio": None,
            "min_alignment": None,
            "error": None,
        }
        for r, v in zip(records, (0.3, 0.6))
    ]
    _interrupt_at_fsync(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        write_report(files[0], records, rows, threshold=0.5)
    assert [f.read_bytes() for f in files] == [f"previous {i}".encode() for i in range(len(files))]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in files)
    monkeypatch.undo()
    written = write_report(files[0], records, rows, threshold=0.5)
    assert written == files[:2]  # the saturation plot; no blocks, no norm layers: two plots left out
    assert (
        files[1].read_bytes().startswith(b"\x89PNG\r\n")
        and "![Saturation vs step](replay_saturation.png)" in files[0].read_text()
    )
    assert files[2].read_bytes() == b"previous 2"  # a plot not drawn this time is left as it was


def test_check_report_names_the_blocked_plot_before_any_work(tmp_path):
    from satmon.io.markdown import check_report

    assert check_report(tmp_path / "r.md") == [
        tmp_path / n for n in ("r.md", "r_saturation.png", "r_sigma_min.png", "r_alignment.png")
    ]
    with pytest.raises(OutputError, match=r"Expected --report to end in \.md, got '.*x\.txt'"):
        check_report(tmp_path / "x.txt")
    (tmp_path / "r_sigma_min.png").mkdir()
    with pytest.raises(OutputError, match="--report's sigma_min plot to name a file ending in .png"):
        check_report(tmp_path / "r.md")
