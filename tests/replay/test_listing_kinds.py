"""The replay's listing, one class of entry at a time (issue 36 classes 1, 2, 5 and 6; issue 38 item 2).

Each class is tested over its members: what is not a regular file (FIFOs, sockets, devices, links to each, broken
links, loops), formats satmon does not read (DeepSpeed, DCP), paths at the system's limits, satmon's own files.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

from satmon.paths import (
    NotRegular,
    kind_of,
    length_problem,
    open_regular,
    require_regular,
)
from satmon.replaying import checkpoints as ck
from satmon.replaying import listing as lst
from satmon.replaying.user_code import ReplayUsageError


def _ckpt(path: Path, step: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"w": torch.zeros(2)}, "iter_num": step}, path)
    return path


def _socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


# ------------------------------------------------------------------------------ class 1: not a regular file
#: member -> (how to make it at a path, the phrase that must name it)
NOT_FILES = {
    "fifo": (lambda p, keep: os.mkfifo(p), "a FIFO (named pipe)"),
    "socket": (lambda p, keep: keep.append(_socket(p)), "a socket"),
    "dev-zero-link": (lambda p, keep: p.symlink_to("/dev/zero"), "a symlink to a character device (/dev/zero)"),
    "dev-null-link": (lambda p, keep: p.symlink_to("/dev/null"), "a symlink to a character device (/dev/null)"),
    "fifo-link": (
        lambda p, keep: (os.mkfifo(p.with_name("real.fifo")), p.symlink_to(p.with_name("real.fifo"))),
        "a symlink to a FIFO (named pipe)",
    ),
    "socket-link": (
        lambda p, keep: (keep.append(_socket(p.with_name("real.sock"))), p.symlink_to(p.with_name("real.sock"))),
        "a symlink to a socket",
    ),
}
#: members that hold nothing: named, and the replay is complete without them
NOTHING_THERE = {
    "broken-link": (lambda p, keep: p.symlink_to(p.with_name("gone.ckpt")), "a broken symlink (to "),
    "link-loop": (lambda p, keep: p.symlink_to(p), "a symlink loop"),
    "two-link-loop": (
        lambda p, keep: (p.with_name("other.pt").symlink_to(p), p.symlink_to(p.with_name("other.pt"))),
        "a symlink loop",
    ),
}


@pytest.fixture
def keep():
    sockets: list[socket.socket] = []
    yield sockets
    for s in sockets:
        s.close()


@pytest.mark.parametrize("member", [*NOT_FILES, *NOTHING_THERE])
@pytest.mark.parametrize("suffix", [".ckpt", ".pt"])
def test_an_entry_that_is_not_a_file_is_named_by_kind_and_never_opened(tmp_path, keep, member, suffix, monkeypatch):
    make, phrase = {**NOT_FILES, **NOTHING_THERE}[member]
    _ckpt(tmp_path / "good.pt")
    odd = tmp_path / f"odd{suffix}"
    make(odd, keep)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(os.fspath(p)) or real_open(p, *a, **k))
    listing = lst.list_checkpoints([tmp_path])
    assert [p.name for p in listing.paths] == ["good.pt"]
    said = dict(listing.notes())
    assert said[odd].startswith(phrase), said  # named on stderr with its kind
    assert "broken" not in said[odd] or member == "broken-link"  # a link to a FIFO or a device is not "broken"
    assert listing.unread() == []  # it holds no checkpoint: the replay is complete without it
    assert not any(o.endswith(odd.name) for o in opened)  # recognised by lstat/stat, never opened


@pytest.mark.parametrize("member", [*NOT_FILES, *NOTHING_THERE])
def test_an_entry_that_is_not_a_file_given_directly_is_refused_in_one_line_naming_its_kind(tmp_path, keep, member):
    make, phrase = {**NOT_FILES, **NOTHING_THERE}[member]
    odd = tmp_path / "odd.ckpt"
    make(odd, keep)
    with pytest.raises(ReplayUsageError) as e:
        lst.list_checkpoints([odd])
    message = str(e.value)
    assert f"which is {phrase}" in message and "pass the checkpoints' files or folder (it was not opened)" in message
    assert "\n" not in message


@pytest.mark.parametrize("member", list(NOT_FILES))
def test_require_regular_names_the_kind_and_open_regular_never_blocks(tmp_path, keep, member):
    make, phrase = NOT_FILES[member]
    odd = tmp_path / "odd.pt"
    make(odd, keep)
    with pytest.raises(NotRegular, match="which is " + phrase.replace("(", r"\(").replace(")", r"\)")):
        require_regular(odd, "--data", "pass a file")
    if "socket" not in member:  # a socket cannot be opened at all (ENXIO); a FIFO opens without blocking, then refused
        with pytest.raises(NotRegular):
            open_regular(odd)


def test_a_folder_reached_twice_and_a_second_name_are_not_an_incomplete_replay(tmp_path):
    """Decision (docs/reference/input_files.md): a second name of a listed file, or of a
    searched folder, holds nothing new."""
    _ckpt(tmp_path / "run" / "a.pt")
    (tmp_path / "run" / "again.pt").symlink_to(tmp_path / "run" / "a.pt")
    os.link(tmp_path / "run" / "a.pt", tmp_path / "run" / "hard.pt")
    (tmp_path / "run" / "up").symlink_to(tmp_path / "run", target_is_directory=True)
    listing = lst.list_checkpoints([tmp_path / "run"])
    assert [p.name for p in listing.paths] == ["a.pt"] and listing.unread() == []


@pytest.mark.parametrize("member", ["fifo", "dev-zero-link", "socket"])
def test_the_cli_names_each_on_stderr_and_exits_0(tmp_path, keep, member, capsys, monkeypatch):
    from satmon.cli.main import main

    make, phrase = NOT_FILES[member]
    factory = tmp_path / "m.py"
    factory.write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))\n"
    )
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).state_dict(), tmp_path / "w.pt")
    torch.save(torch.randn(8, 4), tmp_path / "calib.bin")
    make(tmp_path / "odd.ckpt", keep)
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "replay",
            str(tmp_path),
            "--factory",
            f"{factory}:build",
            "--data",
            "calib.bin",
            "--quiet",
            "--no-twin",
            "--logdir",
            str(tmp_path / "tb"),
        ]
    )
    err = capsys.readouterr().err
    assert f"odd.ckpt: {phrase}: not read." in err and code == 0, err


# ------------------------------------------------------------------------------ class 5: the system's limits
def _deep_folder(root: Path, total: int) -> Path:
    """A folder whose path is over ``total`` bytes, made one level at a time relative to its parent (no path the
    system refuses is ever passed whole)."""
    fd = os.open(root, os.O_RDONLY)
    path = root
    try:
        while len(os.fsencode(str(path))) <= total:
            os.mkdir("d" * 200, dir_fd=fd)
            new = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd, path = new, path / ("d" * 200)
        torch.save({"w": torch.zeros(2)}, f"/proc/self/fd/{fd}/w.pt") if os.path.isdir("/proc/self/fd") else None
    finally:
        os.close(fd)
    return path


@pytest.mark.parametrize("member", ["name-over-name-max", "path-over-path-max"])
def test_a_path_over_the_system_limits_given_is_one_line_of_its_class(tmp_path, member):
    given = tmp_path / ("x" * 300 + ".ckpt") if member == "name-over-name-max" else Path(str(tmp_path) + "/a" * 2100)
    with pytest.raises(ReplayUsageError) as e:
        lst.list_checkpoints([given])
    message = str(e.value)
    limit = "NAME_MAX" if member == "name-over-name-max" else "PATH_MAX"
    assert limit in message and "Errno" not in message and "pass a shorter path" in message and len(message) < 600
    assert kind_of(given).kind == "too-long" and limit in length_problem(given)


def test_a_folder_over_path_max_found_in_a_listing_is_named_and_makes_the_replay_incomplete(tmp_path):
    _ckpt(tmp_path / "ok.pt")
    deep = _deep_folder(tmp_path, 4200)
    listing = lst.list_checkpoints([tmp_path])
    assert [p.name for p in listing.paths] == ["ok.pt"]
    unread = listing.unread()
    assert len(unread) == 1 and str(deep).startswith(str(unread[0][0])) and "PATH_MAX" in unread[0][1]
    assert "Errno" not in unread[0][1]


# ------------------------------------------------------------------------------ class 6: satmon's own files
SATMON_OWN = {
    "satmon_calibration.pt": lambda p: torch.save([torch.zeros(1, 4, dtype=torch.long)], p),
    "satmon_state.pt": lambda p: torch.save({"SaturationMonitor": {"verdict": None}}, p),
    "satmon_verdict.md": lambda p: p.write_text("### GO\n"),
    "satmon_stop.md": lambda p: p.write_text("stop\n"),
    "replay.json.partial.jsonl": lambda p: p.write_text('{"checkpoint": "x"}\n'),
    ".replay.json.satmon-lock": lambda p: p.write_text('{"pid": 1}'),
    ".satmon-lock": lambda p: p.write_text('{"pid": 1}'),
    ".replay.json.ab12cd_9.tmp": lambda p: p.write_text("[1"),
}


@pytest.mark.parametrize("name", list(SATMON_OWN))
def test_satmon_own_files_are_satmons_never_skipped_nor_a_checkpoint(tmp_path, name):
    _ckpt(tmp_path / "run" / "step-1.ckpt")
    SATMON_OWN[name](tmp_path / "run" / name)
    listing = lst.list_checkpoints([tmp_path / "run"])
    assert [p.name for p in listing.paths] == ["step-1.ckpt"]
    assert [p.name for p, _ in listing.satmon_files] == [name]
    assert listing.left_out == [] and listing.notes() == [] and listing.unread() == []
    if name == lst.CALIBRATION_FILE:
        assert listing.calibration == tmp_path / "run" / name  # for the replay to use as --data
    given = lst.list_checkpoints([tmp_path / "run" / name])
    assert given.paths == [] and "satmon's" in given.explicit[0][1] and "not model weights" in given.explicit[0][1]


def test_satmon_file_names_are_the_ones_satmon_writes():
    """The names the listing recognises are the names the writers use (one truth, checked here)."""
    from satmon.drivers import hf
    from satmon.io import lock, trackers

    assert lst.satmon_file(hf.STATE_FILE) and lst.STATE_FILE == hf.STATE_FILE
    assert lst.satmon_file(os.path.basename(lock.lock_path("out/r.json", folder=False)))
    assert lst.satmon_file(os.path.basename(lock.lock_path("grid", folder=True)))
    assert lst.satmon_file(trackers.text_file_name("satmon/verdict")) and lst.satmon_file(
        trackers.text_file_name("satmon/stop")
    )
    package = {p: p.read_text() for p in Path(ck.__file__).parents[1].rglob("*.py") if p.name != "listing.py"}
    from satmon import paths

    assert lst.CALIBRATION_FILE == paths.CALIBRATION_FILE and lst.STATE_FILE == paths.STATE_FILE  # named once
    # the live probe's
    assert "os.path.join(log_dir, CALIBRATION_FILE)" in package[Path(hf.__file__).with_name("live_probe.py")]
    assert any('".partial.jsonl"' in text for text in package.values()) and lst.satmon_file("r.json.partial.jsonl")


def test_a_hugging_face_output_dir_lists_only_its_model_checkpoints(tmp_path):
    """issue 38 item 2: ``checkpoint-N/satmon_state.pt``, the Trainer's ``runs/`` and
    satmon's card are not checkpoints."""
    st = pytest.importorskip("safetensors.torch")
    out = tmp_path / "out"
    for step in (10, 20, 30):
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        st.save_file({"w": torch.full((2,), float(step))}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        (folder / "config.json").write_text("{}")
        torch.save({"state": {}}, folder / "optimizer.pt")
        torch.save({"SaturationMonitor": {}}, folder / "satmon_state.pt")
    (out / "runs" / "Dec01_host").mkdir(parents=True)
    (out / "runs" / "Dec01_host" / "events.out.tfevents.1.host").write_bytes(b"")
    (out / "satmon_verdict.md").write_text("### NO-GO\n")
    listing = lst.list_checkpoints([out])
    assert [p.name for p in listing.paths] == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    assert sorted(p.name for p in listing.states) == ["satmon_state.pt"] * 3
    assert listing.unread() == [] and listing.notes() == []
    infos = [ck.inspect_checkpoint(p, stamps=listing.stamps[p]) for p in listing.paths]
    assert [(i.error, i.global_step) for i in infos] == [(None, 10), (None, 20), (None, 30)]


# ------------------------------------------------------------------------------ class 2: formats satmon does not read
def _dcp(folder: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.arange(6.0)}}, checkpoint_id=str(folder), no_dist=True)


def _deepspeed_lightning(folder: Path) -> None:
    """The layout of Lightning's DeepSpeedStrategy checkpoint (deepspeed is not installed: the files are made here)."""
    (folder / "checkpoint").mkdir(parents=True)
    torch.save({"module": {"w": torch.zeros(2)}}, folder / "checkpoint" / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {}}, folder / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (folder / "latest").write_text("checkpoint")
    (folder / "zero_to_fp32.py").write_text("# DeepSpeed's script\n")


def _deepspeed_raw(folder: Path) -> None:
    (folder / "global_step10").mkdir(parents=True)
    torch.save({"module": {"w": torch.zeros(2)}}, folder / "global_step10" / "mp_rank_00_model_states.pt")
    torch.save({}, folder / "global_step10" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (folder / "latest").write_text("global_step10")
    (folder / "zero_to_fp32.py").write_text("# DeepSpeed's script\n")


FORMATS = {
    "deepspeed-lightning": (
        _deepspeed_lightning,
        "epoch=0-step=10.ckpt",
        "a DeepSpeed checkpoint folder",
        "convert_zero_checkpoint_to_fp32_state_dict",
    ),
    "deepspeed": (_deepspeed_raw, "ds", "a DeepSpeed checkpoint folder", "zero_to_fp32.py"),
}


@pytest.mark.parametrize("member", list(FORMATS))
@pytest.mark.parametrize("given", ["parent", "itself"])
def test_a_format_satmon_does_not_read_is_named_once_with_its_conversion(tmp_path, member, given):
    make, name, what, command = FORMATS[member]
    make(tmp_path / "run" / name)
    _ckpt(tmp_path / "run" / "plain.pt")
    listing = lst.list_checkpoints([tmp_path / "run" if given == "parent" else tmp_path / "run" / name])
    assert [p.name for p in listing.paths] == (["plain.pt"] if given == "parent" else [])
    assert len(listing.unread()) == 1  # one entry for the folder, not one "not a checkpoint" per file
    path, why = listing.unread()[0]
    assert path == tmp_path / "run" / name and why.startswith(what) and command in why
    assert not any("not a checkpoint" in w for _, w in listing.left_out)
    if given == "itself":
        message = lst.nothing_to_replay([path], listing)
        assert what in message and command in message
    import shlex

    lightning, script = (shlex.split(c) for c in why.split("`")[1::2][:2])
    assert lightning[:2] == ["python", "-c"] and str(path.parent / name) in lightning[2]
    compile(lightning[2], "<the command>", "exec")  # valid Python, the folder's name quoted whatever it holds
    assert script[1:3] == [str(path / "zero_to_fp32.py"), str(path)] and script[3].endswith("-consolidated.pt")


def test_a_deepspeed_folder_with_quotes_in_its_name_gets_commands_that_parse(tmp_path):
    import shlex

    folder = tmp_path / 'it\'s "odd" $x'
    _deepspeed_lightning(folder)
    (why,) = [w for _, w in lst.list_checkpoints([tmp_path]).unread()]
    lightning, script = (shlex.split(c) for c in why.split("`")[1::2][:2])
    compile(lightning[2], "<the command>", "exec")
    assert repr(str(folder)) in lightning[2] and script[2] == str(folder)


def test_a_dcp_folder_is_read_without_a_process_group_as_torch_consolidates_it(tmp_path):
    """DCP is read directly: the same tensors as torch's own dcp_to_torch_save, and no process group."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = {
        "model": {"w": torch.randn(3, 5), "b": torch.arange(4, dtype=torch.bfloat16)},
        "step": 12,
        "optimizer": {"lr": 0.1, "m": torch.ones(2)},
    }
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    listing = lst.list_checkpoints([tmp_path])
    assert listing.paths == [tmp_path / "dcp"] and listing.unread() == [] and listing.left_out == []
    info = ck.inspect_checkpoint(listing.paths[0], stamps=listing.stamps[listing.paths[0]])
    assert info.error is None and info.global_step == 12 and info.kind == "state_dict"
    assert {k: (v.shape, v.dtype) for k, v in ck.meta_state_dict(info).items()} == {
        "w": (torch.Size([3, 5]), torch.float32),
        "b": (torch.Size([4]), torch.bfloat16),
    }
    got = ck.state_dict_of(info)
    dcp_to_torch_save(str(tmp_path / "dcp"), str(tmp_path / "torch.pt"))
    want = torch.load(tmp_path / "torch.pt", weights_only=True)["model"]
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert not (dist.is_available() and dist.is_initialized())


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("trust", [False, True])
def test_a_crafted_dcp_metadata_runs_no_code_even_trusted(tmp_path, trust):
    import pickle

    _dcp(tmp_path / "dcp")
    marker = tmp_path / "ran"
    meta = tmp_path / "dcp" / ".metadata"
    md = pickle.loads(meta.read_bytes())  # the test's own file: torch's reader, as torch would
    md.storage_meta = _Payload(marker)
    meta.write_bytes(pickle.dumps(md, protocol=4))
    info = ck.inspect_checkpoint(tmp_path / "dcp", trust=trust)
    assert not marker.exists()
    assert "GLOBAL posix.system" in info.error and "not a DCP metadata type" in info.error
    assert "dcp_to_torch" in info.error and "only for a folder you trust" in info.error


def test_the_dcp_conversion_command_in_a_refusal_makes_a_file_satmon_replays(tmp_path, monkeypatch):
    """A DCP folder satmon refuses (here: over a lowered budget) says how to consolidate it; the command works."""
    import shlex
    import subprocess
    import sys

    from satmon.replaying.budget import BUDGET_ENV

    _dcp(tmp_path / "dcp")
    monkeypatch.setenv(BUDGET_ENV, "0.0001")
    error = ck.inspect_checkpoint(tmp_path / "dcp").error
    assert error.startswith("over satmon's read budget: its .metadata") and "dcp_to_torch" in error
    command = error.split("`")[1]
    done = subprocess.run(
        shlex.split(command.replace("python", sys.executable, 1)),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    monkeypatch.delenv(BUDGET_ENV)
    info = ck.inspect_checkpoint(tmp_path / "dcp-consolidated.pt")
    assert info.error is None and ck.state_dict_of(info)["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_replaying_a_dcp_folder_through_the_cli_exits_0(tmp_path, capsys, monkeypatch):
    import torch.distributed.checkpoint as dcp

    from satmon.cli.main import main

    (tmp_path / "m.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))\n"
    )
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    dcp.save({"model": model.state_dict(), "step": 40}, checkpoint_id=str(tmp_path / "run" / "step40"), no_dist=True)
    torch.save(torch.randn(8, 4), tmp_path / "calib.pt")
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "replay",
            "run",
            "--factory",
            "./m.py:build",
            "--data",
            "calib.pt",
            "--quiet",
            "--no-twin",
            "--logdir",
            str(tmp_path / "tb"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0 and "Replayed 1 of 1" in captured.out and "record no checksum" not in captured.err, captured.err


def test_replaying_a_hugging_face_output_dir_with_satmons_files_exits_0(tmp_path, capsys, monkeypatch):
    """issue 38 item 2 through the CLI: satmon_state.pt x3, the Trainer's runs/, the card: 3 of 3 replayed, exit 0."""
    st = pytest.importorskip("safetensors.torch")
    from satmon.cli.main import main

    (tmp_path / "m.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))\n"
    )
    out = tmp_path / "out"
    for step in (10, 20, 30):
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        st.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        torch.save({"SaturationMonitor": {"verdict": None}}, folder / "satmon_state.pt")
        torch.save({"state": {}}, folder / "optimizer.pt")
    (out / "runs" / "Dec01_host").mkdir(parents=True)
    (out / "satmon_verdict.md").write_text("### NO-GO\n")
    torch.save(torch.randn(8, 4), tmp_path / "calib.pt")
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "replay",
            "out",
            "--factory",
            "./m.py:build",
            "--data",
            "calib.pt",
            "--quiet",
            "--no-twin",
            "--logdir",
            str(tmp_path / "tb"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Replayed 3 of 3" in captured.out and "satmon_state.pt" not in captured.err, captured.err
    assert "not a checkpoint" not in captured.err and "incomplete" not in captured.err


@pytest.mark.parametrize("alone", [False, True])
def test_a_deepspeed_folder_through_the_cli_is_named_once(tmp_path, capsys, monkeypatch, alone):
    """Beside a checkpoint: replayed, the folder named once, exit 1 incomplete; alone: exit
    2, nothing satmon can replay."""
    from satmon.cli.main import main

    (tmp_path / "m.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))\n"
    )
    _deepspeed_lightning(tmp_path / "run" / "epoch=0-step=10.ckpt")
    if not alone:
        torch.save(
            torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).state_dict(), tmp_path / "run" / "w.pt"
        )
    torch.save(torch.randn(8, 4), tmp_path / "calib.pt")
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "replay",
            "run",
            "--factory",
            "./m.py:build",
            "--data",
            "calib.pt",
            "--quiet",
            "--no-twin",
            "--logdir",
            str(tmp_path / "tb"),
        ]
    )
    err = capsys.readouterr().err
    assert code == (2 if alone else 1), err
    assert "not a checkpoint" not in err and "mp_rank_00_model_states.pt:" not in err
    if alone:
        assert "Nothing satmon can replay under 'run': run/epoch=0-step=10.ckpt is a DeepSpeed checkpoint folder" in err
    else:
        last = err.strip().splitlines()[-1]
        assert last.startswith("satmon replay: incomplete: 1 of 1 checkpoint(s) replayed") and "a DeepSpeed" in last
        assert err.count("not replayed: run/epoch=0-step=10.ckpt: a DeepSpeed checkpoint folder") == 1
