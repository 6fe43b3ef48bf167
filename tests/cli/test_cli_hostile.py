"""Hostile files and environments for `satmon report`, `satmon calibrate` and every command (issue 30, round 4).

Event files are input a user may be handed: they may hold terminal escape sequences, lie about their record
lengths, be FIFOs or devices named like event files. A working directory may hold a `tensorboard.py`. A command may
meet an error nothing expected. In every case: no control character from a file reaches the terminal, nothing
blocks, nothing is allocated for a length a file claims, no code from the working directory runs, and the command
ends with its own lines, never a traceback. docs/reference/reliability.md counts :data:`HOSTILE`.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from satmon.cli.main import main
from satmon.io.tags import TAG

ROOT = Path(__file__).resolve().parents[2]

#: the cases of this file (docs/reference/reliability.md: "hostile files and environments")
HOSTILE = (
    "report-escape-sequences",
    "report-fifo-device-folder-named-like-event-files",
    "report-record-claims-1-tb",
    "report-record-longer-than-the-file",
    "report-damaged-record-mid-file",
    "report-tensorboard-py-in-cwd",
    "calibrate-escape-sequences",
    "unexpected-error-one-line",
    "background-thread-error-one-line",
)

#: what a hostile file would send to the terminal: CSI clear screen, OSC 0 title, OSC 8 link, OSC 52 clipboard write,
#: a C1 CSI (0x9b), a carriage return over a forged green GO, a right-to-left override, BEL, NUL, DEL
NASTY = (
    "\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\\x1b]52;c;cm0gLXJmIH4=\x07"
    "\x9b31m\r\x1b[32mGO: keep it\x1b[0m \u202egnp\x00\x7f"
)


def _printable(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def _record(data: bytes) -> bytes:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data))


def _run(folder: Path, card: str = "### satmon verdict: NO-GO\n\nall good", layer: str = "h.0.dyt") -> Path:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(folder)) as w:
        w.add_scalar(TAG.saturation, 0.25, 4)
        w.add_scalar(TAG.verdict, 0.0, 4)
        w.add_scalar(TAG.layer_saturation(layer), 0.5, 4)
        w.add_text(TAG.verdict_text, card, 4)
    return next(folder.glob("events.out.tfevents.*"))


def test_report_prints_no_control_character_from_an_event_file(tmp_path, capsys):
    """0.2 printed the card's escape sequences as they were: it cleared the screen, set the title, forged a GO."""
    _run(tmp_path / f"run{NASTY[:12]}", card=f"### satmon verdict: NO-GO\n\n{NASTY}", layer=f"h.0{NASTY[4:20]}")
    assert main(["report", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert _printable(out + err), repr(out + err)
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in out and "\\x1b]52;c;" in out and "\\x9b31m\\x0d\\x1b[32mGO" in out
    assert "\\u202egnp\\x00\\x7f" in out and "h.0\\x1b]0;pwned\\x07" in out and "satmon verdict: NO-GO" in out


def test_report_never_opens_a_fifo_nor_reads_a_device_or_folder_named_like_an_event_file(tmp_path):
    """0.2 blocked forever in open() on a FIFO named like an event file. Run in a process
    of its own, under a timeout."""
    good = _run(tmp_path / "run")
    os.mkfifo(tmp_path / "run" / "events.out.tfevents.2.fifo")
    (tmp_path / "run" / "events.out.tfevents.3.zero").symlink_to("/dev/zero")
    (tmp_path / "run" / "events.out.tfevents.4.dir").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "satmon.cli.main", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "satmon verdict: NO-GO" in done.stdout, done.stderr
    notes = [line for line in done.stderr.splitlines() if "not a regular file" in line]
    assert len(notes) == 3 and all(line.startswith("satmon report: note: ") for line in notes), done.stderr
    assert good.name not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("length", "said"),
    [(10**12, "a record of 1,000,000,000,000 bytes"), (100_000_000, "a record of 100,000,000 bytes")],
    ids=["claims-1-tb", "longer-than-the-file"],
)
def test_report_bounds_a_record_length_before_allocating_it(tmp_path, capsys, length, said):
    """0.2: a MemoryError traceback for a first record that claims 1 TB (its length's CRC is right)."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    head = struct.pack("<Q", length)
    (tmp_path / "events.out.tfevents.1.big").write_bytes(head + struct.pack("<I", masked_crc32c(head)) + b"x" * 64)
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"note: {tmp_path}/events.out.tfevents.1.big: damaged at byte 0 ({said}" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("satmon report: no satmon data under")


def test_report_keeps_the_records_before_a_damaged_one(tmp_path, capsys):
    path = _run(tmp_path)
    data = path.read_bytes()
    from tensorboard.compat.proto import event_pb2

    extra = event_pb2.Event(step=9, wall_time=1.0)
    extra.summary.value.add(tag=TAG.saturation, simple_value=0.75)
    damaged = bytearray(_record(extra.SerializeToString()))
    damaged[14] ^= 0xFF  # a byte of the record's data: its CRC fails
    path.write_bytes(data + bytes(damaged) + _record(extra.SerializeToString()))
    assert main(["report", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "0.2500 @ 4" in out and "@ 9" not in out  # what came before is read; nothing after the damage
    assert f"damaged at byte {len(data):,} (a record that fails its CRC); the records before it were read" in err


def test_report_runs_no_tensorboard_py_from_the_working_directory(tmp_path):
    """An empty PYTHONPATH entry (``export PYTHONPATH=$PYTHONPATH:/x`` with it unset) puts the working directory on
    sys.path: 0.2 imported a tensorboard.py lying there."""
    _run(tmp_path / "run")
    marker = tmp_path / "ran"
    (tmp_path / "tensorboard.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep + str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "satmon.cli.main", "report", "run"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "satmon verdict: NO-GO" in done.stdout, done.stderr
    assert not marker.exists()


def test_calibrate_prints_no_control_character_from_its_input(tmp_path, capsys, monkeypatch):
    """A CSV holding control characters is refused as binary; JSON escapes (\\u001b) bring them into group names."""
    import json

    monkeypatch.chdir(tmp_path)
    groups = (f"small{NASTY[:8]}", f"big{NASTY[8:30]}")
    cells = [
        dict(name=n, saturation=s, delta=d, group=groups[i // 2])
        for i, (n, s, d) in enumerate([("a", 0.6, -0.1), ("b", 0.2, 0.1), ("c", 0.7, -0.2), ("d", 0.3, 0.2)])
    ]
    (tmp_path / "cells.json").write_text(json.dumps(cells))
    assert main(["calibrate", "--cells", "cells.json", "--out", "out", "--no-plot"]) == 0
    out, err = capsys.readouterr()
    assert _printable(out + err) and "small\\x1b[2J" in out, repr(out)


def test_an_unexpected_error_ends_in_one_line_without_a_traceback(monkeypatch, capsys):
    from satmon.cli import report

    def broken(argv):
        raise RuntimeError(f"a bug{NASTY[:6]}")

    monkeypatch.setattr(report, "main", broken)
    assert main(["report", "."]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and _printable(err)
    assert (
        err.startswith("satmon report: stopped by an unexpected error: RuntimeError: a bug\\x1b[2J")
        and "SATMON_TRACEBACK=1" in err
    )


def test_a_background_thread_error_the_command_did_not_see_ends_in_one_line(monkeypatch, capsys):
    """A thread that dies (TensorBoard's writer on a full disk) printed its traceback; a finalizer's error too."""
    import errno
    import threading

    from satmon.cli import report

    class Finalized:
        def __del__(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    def quiet_failure(argv):
        t = threading.Thread(target=lambda: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
        t.start()
        t.join()
        Finalized()  # dropped at once: its __del__ raises
        return 0

    monkeypatch.setattr(report, "main", quiet_failure)
    hooks = threading.excepthook, sys.unraisablehook
    assert main(["report", "."]) == 1
    assert (threading.excepthook, sys.unraisablehook) == hooks  # restored
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err and len(err.strip().splitlines()) == 2, err
    assert "satmon report: note: an error was ignored while an object was cleaned up: OSError: [Errno 28]" in err
    assert err.strip().splitlines()[-1] == (
        "satmon report: a background thread failed: OSError: [Errno 28] No space left "
        "on device; what it was writing (TensorBoard's event files) may be incomplete."
    )


def test_reliability_counts_these_cases():
    """docs/reference/reliability.md's figure is :data:`HOSTILE`, and every name in it is a case here."""
    import re

    text = (ROOT / "docs" / "reference" / "reliability.md").read_text()
    found = re.search(r"\*\*hostile files and environments\*\*: (\d+)", text)
    assert found and int(found.group(1)) == len(HOSTILE) == len(set(HOSTILE))
    here = Path(__file__).read_text()
    assert here.count("\ndef test_") - 1 + 1 == len(HOSTILE)  # one parametrised test holds two cases, this one none
