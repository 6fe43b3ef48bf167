"""The fault matrix: what satmon does under each hostile or unlucky input, one asserted outcome per case
(docs/reference/reliability.md and docs/reference/input_files.md point here; reliability.md gives the figures,
checked against these tables by ``test_reliability_figures_are_the_matrix``). Every replay case asserts the exit code,
what the user is told, that no code from a file ran unless asked for, whether the user's model class was ever built (and
on which device), and that nothing the user had was lost."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import popen_as_from_a_terminal, tiny_lit, token_loader, trainer
from satmon.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
# --- security and replay input ---
MODEL = "satmon.demos.lit:LitLM"
FACTORY_SRC = (
    "from satmon.demos.gpt import GPT, GPTConfig\n"
    "def build():\n    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16))\n"
)
#: The user's model class, recording every construction (the device of its first parameter) in ./built, and
#: changing a checkpoint underneath at its N-th real construction when SATMON_TEST_MUTATE says so.
RECORDER_SRC = textwrap.dedent("""
    import os, struct, zipfile
    from satmon.demos.lit import LitLM

    def _mutate():
        spec = os.environ.get("SATMON_TEST_MUTATE")
        if not spec:
            return
        path, how, at = spec.split("|")
        if sum(line == "cpu\\n" for line in open("built")) != int(at):
            return
        if how == "truncate":  # a job starts rewriting the file: it is cut short
            os.truncate(path, os.path.getsize(path) // 3)
        else:  # rewritten in place, same size: NaN where the first tensor's bytes were
            with zipfile.ZipFile(path) as z:
                info = [i for i in z.infolist() if i.filename.endswith("/data/0")][0]
            with open(path, "r+b") as f:
                f.seek(info.header_offset)
                n, m = struct.unpack("<HH", f.read(30)[26:30])
                f.seek(info.header_offset + 30 + n + m)
                f.write(struct.pack("<f", float("nan")) * (info.file_size // 4))
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a coarse clock may not tick

    class Recorder(LitLM):
        def __init__(self, **kw):
            super().__init__(**kw)
            with open("built", "a") as f:
                f.write(next(self.parameters()).device.type + "\\n")
            _mutate()

    class Wrong(Recorder):  # another architecture than the checkpoints'
        def __init__(self, **kw):
            super().__init__(**dict(kw, d_model=48))
""")
RECORDER, WRONG = "./recorder.py:Recorder", "./recorder.py:Wrong"


class Payload:
    """Unpickling this runs ``exec``: one line appended to ``marker`` per load (the evidence
    that code from a file ran)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'a').write('ran\\n')",)


class ShellPayload:
    """``os.system`` (pickled as ``posix.system``): the global torch refuses must be named, as unsafe."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"echo ran >> {self.marker}",)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One real Lightning checkpoint (step 2 of a tiny DyT run) and its calibration batches."""
    root = tmp_path_factory.mktemp("world")
    ckpt = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        trainer(root, max_steps=2, enable_checkpointing=True, callbacks=[ckpt]).fit(tiny_lit(), token_loader(2))
    (path,) = root.glob("*.ckpt")
    torch.save(list(token_loader(2)), root / "calib.pt")
    return {"ckpt": torch.load(path, weights_only=True), "calib": root / "calib.pt"}


class Folder:
    """One case's working folder: files to replay, the payload marker, the model-construction record."""

    def __init__(self, tmp: Path, world: dict) -> None:
        self.tmp, self.world, self.marker = tmp, world, tmp / "payload_ran"
        shutil.copy(world["calib"], tmp / "calib.pt")
        (tmp / "mymodels.py").write_text(FACTORY_SRC)
        (tmp / "recorder.py").write_text(RECORDER_SRC)
        (tmp / "afile").write_text("not a folder")

    def ckpt(
        self, name: str, edit: Callable[[dict], None] | None = None, payload: type | None = None, step: int = 2
    ) -> str:
        ckpt = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.world["ckpt"].items()}
        ckpt["global_step"] = step
        if edit is not None:
            edit(ckpt)
        if payload is not None:
            ckpt["user_extra"] = payload(self.marker)
        (self.tmp / name).parent.mkdir(parents=True, exist_ok=True)
        torch.save(ckpt, self.tmp / name)
        return name

    def run_folder(self, n: int = 4, name: str = "ckpts") -> str:
        for i in range(n):
            self.ckpt(f"{name}/step-{2 * (i + 1)}.ckpt", step=2 * (i + 1))
        return name

    def plain(self, name: str, payload: bool = False) -> str:
        sd = {k.removeprefix("model."): v for k, v in self.world["ckpt"]["state_dict"].items()}
        torch.save({"model": sd, "iter_num": 2, **({"x": Payload(self.marker)} if payload else {})}, self.tmp / name)
        return name

    @property
    def runs(self) -> int:
        return len(self.marker.read_text().splitlines()) if self.marker.exists() else 0

    @property
    def built(self) -> tuple[str, ...]:
        return tuple((self.tmp / "built").read_text().split()) if (self.tmp / "built").exists() else ()


def _nan(ckpt: dict) -> None:
    w = ckpt["state_dict"]["model.blocks.0.attn.c_attn.weight"].clone()
    w[:, 0] = float("nan")
    ckpt["state_dict"]["model.blocks.0.attn.c_attn.weight"] = w


def _inf_embedding(ckpt: dict) -> None:
    e = torch.full_like(ckpt["state_dict"]["model.tok_emb.weight"], float("inf"))
    ckpt["state_dict"]["model.tok_emb.weight"] = ckpt["state_dict"]["model.lm_head.weight"] = e  # tied weights


def _big(ckpt: dict) -> None:  # a 450 KB file asking for a 1.2 B-parameter model
    ckpt["hyper_parameters"] = dict(ckpt["hyper_parameters"], d_model=2048, n_layers=24, n_heads=16)


def _text_in_folder(f: Folder) -> list[str]:
    f.ckpt("ckpts/good.ckpt")
    (f.tmp / "ckpts" / "notes.ckpt").write_text("trained 2 steps, lr 3e-3\n")
    return ["ckpts", "--model", MODEL, "--data", "calib.pt"]


def _seq_len_zero(f: Folder) -> list[str]:
    hp = dict(seq_len=0, batch_size=4, train_tokens=20_000, val_tokens=2_000, seed=0)
    name = f.ckpt("dm.ckpt", lambda c: c.update(datamodule_hyper_parameters=hp))
    return [name, "--model", MODEL, "--datamodule", "satmon.demos.corpus:CorpusDataModule"]


def _deep_hparams(f: Folder) -> list[str]:
    """A 60,000-deep nested list in the datamodule's hyper-parameters, written as flat pickle opcodes."""
    f.ckpt("src.ckpt", lambda c: c.update(datamodule_hyper_parameters={"seq_len": 16, "blob": "MARKER"}))
    (f.tmp / "ckpts").mkdir()
    with zipfile.ZipFile(f.tmp / "src.ckpt") as zi, zipfile.ZipFile(f.tmp / "ckpts" / "deep.ckpt", "w") as zo:
        for item in zi.infolist():
            data = zi.read(item.filename)
            if item.filename.endswith("data.pkl"):
                data = data.replace(b"X\x06\x00\x00\x00MARKER", b"]" * 60_000 + b"a" * 59_999)
            zo.writestr(item.filename, data)
    (f.tmp / "src.ckpt").unlink()
    return ["ckpts", "--model", RECORDER, "--datamodule", "satmon.demos.corpus:CorpusDataModule"]


def _lookalike_modules(f: Folder) -> list[str]:
    """An installed user package whose dependency has a look-alike in the working directory, and a
    ``tensorboard.py`` there too: none of the working directory's files may run."""
    site = f.tmp / "site"
    (site / "userpkg_fm").mkdir(parents=True)
    (site / "satmon_dep_fm.py").write_text("OK = True\n")
    (site / "userpkg_fm" / "__init__.py").write_text(
        "import satmon_dep_fm\nfrom satmon.demos.lit import LitLM as Lit\n"
    )
    for shadow in ("satmon_dep_fm.py", "tensorboard.py", "matplotlib.py"):
        (f.tmp / shadow).write_text(f"open({str(f.marker)!r}, 'a').write('{shadow}\\n')\n")
    return [f.ckpt("a.ckpt"), "--model", "userpkg_fm:Lit", "--data", "calib.pt", "--report", "r.md"]


def _symlinked_checkpoints(f: Folder) -> list[str]:
    """A run folder whose checkpoints/ is a symlink, a loop back up, and a second link to one file."""
    store = f.run_folder(3, "store")
    run = f.tmp / "run" / "version_0"
    run.mkdir(parents=True)
    (run / "checkpoints").symlink_to(f.tmp / store, target_is_directory=True)
    (f.tmp / store / "up").symlink_to(f.tmp / "run", target_is_directory=True)
    (f.tmp / store / "copy.ckpt").symlink_to(f.tmp / store / "step-2.ckpt")
    f.ckpt("run/version_0/final.ckpt", step=8)
    return ["run", "--model", RECORDER, "--data", "calib.pt", "--json", "r.json"]


def _hf_folder(f: Folder) -> list[str]:
    """A Hugging Face-style output folder: checkpoint-N/ with model.safetensors, trainer_state.json and the
    Trainer's optimizer, scheduler and RNG files (the RNG file holds numpy state: refused if it were read)."""
    import numpy as np
    from safetensors.torch import save_file

    sd = {k.removeprefix("model."): v for k, v in f.world["ckpt"]["state_dict"].items() if k != "model.lm_head.weight"}
    for step in (10, 20):
        folder = f.tmp / "hf" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
        torch.save({"state": {}, "param_groups": []}, folder / "optimizer.pt")
        torch.save({"last_epoch": step}, folder / "scheduler.pt")
        torch.save({"numpy": np.random.get_state()}, folder / "rng_state.pth")
        torch.save({"x": 1}, folder / "training_args.bin")
    return ["hf", "--factory", "./mymodels.py:build", "--data", "calib.pt"]


def _blocked_plot(f: Folder) -> list[str]:
    (f.tmp / "out" / "r_saturation.png").mkdir(parents=True)
    return [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--report", "out/r.md"]


def _read_only(name: str) -> Callable[[Folder], list[str]]:
    def make(f: Folder) -> list[str]:
        (f.tmp / name).write_text("[]\n" if name.endswith(".json") else "# previous report\n")
        os.chmod(f.tmp / name, 0o444)
        return [
            f.ckpt("p.ckpt", payload=Payload),
            *DATA_TRUSTED,
            "--json" if name.endswith(".json") else "--report",
            name,
        ]

    return make


def _run_name_a_file(f: Folder) -> list[str]:
    (f.tmp / "tb2").mkdir()
    (f.tmp / "tb2" / "replay").write_text("a file where the run folder goes")
    return [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--logdir", "tb2"]


def _partial_a_folder(f: Folder) -> list[str]:
    (f.tmp / "r.json.partial.jsonl").mkdir()
    return [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--json", "r.json"]


def _temporary_name_taken(f: Folder) -> list[str]:
    """A folder at 0.2's temporary name (``r.json.tmp``): the temporary file is another, random name now."""
    (f.tmp / "r.json.tmp").mkdir()
    return [f.ckpt("a.ckpt"), *DATA, "--json", "r.json"]


def _only(*names: str) -> Callable[[Folder], list[str]]:
    def make(f: Folder) -> list[str]:
        (f.tmp / "d").mkdir()
        for n in names:
            if n.endswith((".pt", ".pth")):
                shutil.copy(f.tmp / "calib.pt", f.tmp / "d" / n)
            else:
                (f.tmp / "d" / n).write_text("x")
        return ["d", "--model", RECORDER, "--data", "d/calib.pt" if "calib.pt" in names else "calib.pt"]

    return make


def _mutated(how: str) -> Callable[[Folder], list[str]]:
    """A job rewrites the third checkpoint while the folder is replayed (during the first model's construction)."""

    def make(f: Folder) -> list[str]:
        folder = f.run_folder(4)
        os.environ["SATMON_TEST_MUTATE"] = f"{f.tmp / folder / 'step-6.ckpt'}|{how}|1"
        return [folder, "--model", RECORDER, "--data", "calib.pt", "--json", "r.json"]

    return make


def _zero_tensor_bytes(path: Path, n: int = 4096) -> None:
    """Zero ``n`` bytes in the middle of the largest tensor record, the zip directory left
    intact (its CRC now wrong)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as fh:
        fh.seek(info.header_offset)
        name_len, extra_len = struct.unpack("<HH", fh.read(30)[26:30])
        start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2 - n // 2
        fh.seek(start)
        assert fh.read(n) != bytes(n)  # the weights there are not zeros already
        fh.seek(start)
        fh.write(bytes(n))


def _corrupt_tensor(f: Folder) -> list[str]:
    f.ckpt("ckpts/good.ckpt")
    _zero_tensor_bytes(f.tmp / f.ckpt("ckpts/bad.ckpt", step=4))
    return ["ckpts", "--model", RECORDER, "--data", "calib.pt"]


def _corrupt_pickle(f: Folder) -> list[str]:
    """One character of the pickle changed in place (a valid pickle still: only the zip's CRC-32 knows)."""
    f.ckpt("ckpts/good.ckpt")
    path = f.tmp / f.ckpt("ckpts/bad.ckpt", step=4)
    data = path.read_bytes()
    at = data.index(b"pytorch-lightning_version") + len(b"pytorch-lightning_version") + 6  # inside the version string
    path.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :])
    return ["ckpts", "--model", RECORDER, "--data", "calib.pt"]


def _plain_sd(f: Folder) -> dict:
    # tied to tok_emb: safetensors stores it once
    return {
        k.removeprefix("model."): v.contiguous()
        for k, v in f.world["ckpt"]["state_dict"].items()
        if k != "model.lm_head.weight"
    }


def _damaged_safetensors(f: Folder) -> list[str]:
    """Weights damaged inside a .safetensors file: it records no checksum, so satmon can only say it could not check."""
    from safetensors.torch import save_file

    save_file(_plain_sd(f), str(f.tmp / "w.safetensors"))
    data = bytearray((f.tmp / "w.safetensors").read_bytes())
    data[-4096:-2048] = bytes(2048)
    (f.tmp / "w.safetensors").write_bytes(bytes(data))
    return ["w.safetensors", "--factory", "./mymodels.py:build", "--data", "calib.pt"]


def _safetensors_with_a_tail(f: Folder) -> list[str]:
    """Bytes appended after the last tensor (a polyglot, or two files concatenated): the format has none."""
    from safetensors.torch import save_file

    save_file(_plain_sd(f), str(f.tmp / "w.safetensors"))
    with open(f.tmp / "w.safetensors", "ab") as fh:
        fh.write(b"PK\x03\x04 and more")
    return ["w.safetensors", "--factory", "./mymodels.py:build", "--data", "calib.pt"]


def _partial_links_to_a_user_file(f: Folder) -> list[str]:
    """The partial file's name is a symlink to a file of the user's, and another name is a hard link to one: writing
    through either would destroy it."""
    (f.tmp / "victim.txt").write_text("the user's notes\n")
    (f.tmp / "r.json.partial.jsonl").symlink_to(f.tmp / "victim.txt")
    (f.tmp / "victim2.txt").write_text("more notes\n")
    os.link(f.tmp / "victim2.txt", f.tmp / "s.jsonl.partial.jsonl")
    _SECOND[:] = [f.ckpt("b.ckpt"), *DATA, "--json", "s.jsonl", "--logdir", "tb", "--quiet"]
    return [f.ckpt("a.ckpt"), *DATA, "--json", "r.json"]


def _victims_untouched(tmp: Path) -> None:
    here = os.getcwd()
    os.chdir(tmp)
    try:
        assert main(["replay", *_SECOND]) == 0  # the hard-linked name, in a second run
    finally:
        os.chdir(here)
    assert (tmp / "victim.txt").read_text() == "the user's notes\n" and (
        tmp / "victim2.txt"
    ).read_text() == "more notes\n"
    assert len(json.loads((tmp / "r.json").read_text())) == 1 and not (tmp / "r.json.partial.jsonl").exists()


_SECOND: list[str] = []


def _data_is_the_json(f: Folder) -> list[str]:
    shutil.copy(f.tmp / "calib.pt", f.tmp / "calib.json")
    return [
        f.ckpt("p.ckpt", payload=Payload),
        "--model",
        RECORDER,
        "--data",
        "calib.json",
        "--trust-checkpoints",
        "--json",
        "calib.json",
    ]


def _legacy_file(f: Folder) -> list[str]:
    torch.save({"model": _plain_sd(f), "iter_num": 2}, f.tmp / "old.pt", _use_new_zipfile_serialization=False)
    return ["old.pt", "--factory", "./mymodels.py:build", "--data", "calib.pt"]


class _Listing(list):
    """What os.scandir returns, as far as its callers use it: iterable, and a context manager (pathlib's glob)."""

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def close(self) -> None:
        return None


class _Entry:
    """A folder entry whose stat fails as in a folder this user may list but not search (mode r--)."""

    def __init__(self, entry: os.DirEntry) -> None:
        self.name, self.path = entry.name, entry.path

    def stat(self, follow_symlinks: bool = True):
        raise PermissionError(13, "Permission denied", self.path)

    def is_symlink(self) -> bool:
        raise PermissionError(13, "Permission denied", self.path)

    is_dir = is_file = stat


def _no_permission(how: str) -> Callable[[Folder], list[str]]:
    """What mode 000 (``folder``, ``file``) or r-- (``search``) does for an ordinary user; root reads everything, so the
    refusal the kernel would give is made here (tests/replay/test_unreadable.py does it for real when not root)."""

    def make(f: Folder) -> list[str]:
        f.run_folder(2)
        locked = f.tmp / "ckpts" / ("locked" if how != "file" else "step-4.ckpt")
        if how != "file":
            f.ckpt("ckpts/locked/step-6.ckpt", step=6)
        real_scandir, real_open = os.scandir, os.open

        def scandir(path):
            here = os.path.abspath(path) == str(locked)
            if here and how == "folder":
                raise PermissionError(13, "Permission denied", str(path))
            with real_scandir(path) as it:
                entries = list(it)
            return _Listing([_Entry(e) for e in entries] if here else entries)

        def opened(path, flags, *a, **k):
            if os.path.abspath(path) == str(locked) and how == "file":
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, flags, *a, **k)

        f.monkeypatch.setattr(os, "scandir", scandir)
        f.monkeypatch.setattr(os, "open", opened)
        return ["ckpts", "--model", RECORDER, "--data", "calib.pt"]

    return make


def _special(kind: str) -> Callable[[Folder], list[str]]:
    """Files that are not regular files where checkpoints are looked for: never opened (a FIFO would block forever)."""

    def make(f: Folder) -> list[str]:
        folder = f.run_folder(1)
        if kind == "fifo-in-folder":
            os.mkfifo(f.tmp / folder / "step-4.ckpt")
        elif kind == "dev-zero-link":
            (f.tmp / folder / "step-4.ckpt").symlink_to("/dev/zero")
        elif kind == "socket-in-folder":
            import socket

            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(f.tmp / folder / "s.ckpt"))
            f.monkeypatch.setattr(f, "socket", sock, raising=False)
        elif kind == "fifo-given":
            os.mkfifo(f.tmp / "p.ckpt")
            return ["p.ckpt", *DATA_TRUSTED]
        elif kind == "dev-zero-given":
            return ["/dev/zero", *DATA_TRUSTED]
        elif kind == "huge-sparse":
            with open(f.tmp / folder / "step-4.ckpt", "wb") as fh:
                fh.truncate(1 << 40)  # a terabyte of nothing
        return [folder, "--model", RECORDER, "--data", "calib.pt"]

    return make


def _escapes_in_names(f: Folder) -> list[str]:
    """Checkpoint names that would drive the terminal (clear the screen, set its title, an OSC 8 link, an OSC 52
    clipboard write, a C1 CSI, a carriage return over a forged line, a right-to-left override) and a text file's
    first line that would forge a green GO: every one is printed escaped."""
    f.ckpt("ckpts/step-2\x1b[2J\x1b]0;pwned\x07.ckpt", step=2)
    f.ckpt("ckpts/step-4\x1b]8;;http://x\x1b\\\x1b]52;c;cm0gLXJmIH4=\x07.ckpt", step=4)
    f.ckpt("ckpts/step-6\x9b2J\rGO \u202egnp.ckpt", step=6)
    (f.tmp / "ckpts" / "notes\x1b[32m.ckpt").write_text("\x1b[32mGO: keep it\x1b[0m\r\n")
    return ["ckpts", "--model", RECORDER, "--data", "calib.pt"]


def _literal(f: Folder) -> list[str]:
    return [f.ckpt("a.ckpt"), *DATA, "--name", "$HOME", "--logdir", "~/tb"]


def _literal_check(tmp: Path) -> None:
    assert list((tmp / "~" / "tb" / "$HOME").glob("version_0/events.out.tfevents.*"))  # written where the names say
    assert not (tmp / "home" / "tb").exists() and not list((tmp / "home").iterdir())  # nothing under the real $HOME


def _next_version_a_file(f: Folder) -> list[str]:
    (f.tmp / "tb" / "replay" / "version_0").mkdir(parents=True)
    (f.tmp / "tb" / "replay" / "version_1").write_text("a file where the next run folder would go")
    return [f.ckpt("a.ckpt"), *DATA, "--logdir", "tb"]


def _next_version_check(tmp: Path) -> None:
    assert (tmp / "tb" / "replay" / "version_1").read_text().startswith("a file")
    assert list((tmp / "tb" / "replay" / "version_2").glob("events.out.tfevents.*"))


def _run_folder_links_out(f: Folder) -> list[str]:
    (f.tmp / "elsewhere").mkdir()
    (f.tmp / "tb2").mkdir()
    (f.tmp / "tb2" / "replay").symlink_to(f.tmp / "elsewhere", target_is_directory=True)
    return [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--logdir", "tb2"]


def _cwd_module(pythonpath: str) -> Callable[[Folder], list[str]]:
    """``--model mymodel:Net`` where only the working directory holds a mymodel.py, with an empty, '.' or relative
    PYTHONPATH entry (or python -m) putting the working directory on sys.path: neither it nor a tensorboard.py there
    may run."""

    def make(f: Folder) -> list[str]:
        for shadow in ("mymodel.py", "tensorboard.py"):
            (f.tmp / shadow).write_text(
                f"open({str(f.marker)!r}, 'a').write('{shadow}\\n')\nfrom satmon.demos.lit import LitLM as Net\n"
            )
        (f.tmp / "rel").mkdir()
        (f.tmp / "rel" / "mymodel.py").write_text((f.tmp / "mymodel.py").read_text())
        f.pythonpath = pythonpath
        return [f.ckpt("a.ckpt"), "--model", "mymodel:Net", "--data", "calib.pt"]

    return make


@dataclass
class Case:
    id: str
    argv: Callable[[Folder], list[str]]
    exit: int
    said: tuple[str, ...] = ()  #: in stdout + stderr
    runs: int = 0  #: times the payload (or a look-alike module) ran
    console_script: bool = False  #: run the installed ``satmon`` command (its own sys.path), not main()
    built: tuple[str, ...] | None = None  #: the Recorder's constructions (device each), when the case uses it
    kind: str = "fault"  #: "bad-input" (refused: exit 2, nothing done) or "fault" (the replay goes on or ends cleanly)
    absent: tuple[str, ...] = ()  #: never said
    last: str | None = None  #: a regex the last line on stderr matches
    check: Callable[[Path], None] | None = None  #: more assertions on the case's folder


DATA = ["--model", MODEL, "--data", "calib.pt"]
IGNORED = "they name the working directory or a folder of it, from an empty, '.' or relative PYTHONPATH entry"
#: Trusted, so that a payload would run as soon as a checkpoint is read: the refusals below come before it.
DATA_TRUSTED = ["--model", RECORDER, "--data", "calib.pt", "--trust-checkpoints"]
NO_TRUST = ("--trust-checkpoints would", "Pass --trust-checkpoints", "pass --trust-checkpoints")
RULE_NUMBERS = [
    ("--threshold", "1.5", "in (0, 1)", "1.5"),
    ("--threshold", "nan", "in (0, 1)", "nan"),
    ("--threshold", "0", "in (0, 1)", "0.0"),
    ("--level", "-2", "> 0", "-2.0"),
    ("--level", "inf", "> 0", "inf"),
    ("--collapse-threshold", "2", "in (0, 1)", "2.0"),
]
COUNTS = [("--batches", "0"), ("--batch-size", "-1"), ("--threads", "0")]
CASES = [
    # code stored in checkpoints
    Case(
        "payload-ckpt-refused",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA],
        1,
        (
            "skipped p.ckpt",
            "refused by torch.load(weights_only=True)",
            "GLOBAL exec",
            "runs Python code: not safe to allow",
        ),
        absent=NO_TRUST,
    ),
    Case(
        "payload-os-system-named-unsafe",
        lambda f: [f.ckpt("p.ckpt", payload=ShellPayload), *DATA],
        1,
        ("its pickle calls posix.system (GLOBAL posix.system), which runs a shell command: not safe to allow",),
        absent=NO_TRUST,
    ),
    Case(
        "payload-pt-refused",
        lambda f: [f.plain("p.pt", payload=True), "--factory", "mymodels.py:build", "--data", "calib.pt"],
        1,
        ("p.pt", "GLOBAL exec", "not safe to allow"),
        absent=NO_TRUST,
    ),
    Case(
        "payload-then-usage-error",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), "--model", MODEL, "--datamodule", "satmon.demos.corpus:Nope"],
        2,
        ("has no attribute 'Nope'",),
        kind="bad-input",
    ),
    Case(
        "payload-trusted-then-usage-error",
        lambda f: [
            f.ckpt("p.ckpt", payload=Payload),
            "--trust-checkpoints",
            "--model",
            "satmon.demos.lit:build_model",
            "--data",
            "calib.pt",
        ],
        2,
        ("expected a LightningModule class",),
        kind="bad-input",
    ),
    Case(
        "payload-trusted-loads-once",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA, "--trust-checkpoints"],
        0,
        ("Replayed 1 of 1", "runs code stored in them"),
        runs=1,
    ),
    # the rule's numbers and counts: refused before any checkpoint is read, with a trusted payload waiting
    *[
        Case(
            f"rule{flag[1:]}-{value}",
            lambda f, flag=flag, value=value: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, flag, value],
            2,
            (f"Expected {flag} {what}", f"got {got}"),
            built=(),
            kind="bad-input",
        )
        for flag, value, what, got in RULE_NUMBERS
    ],
    *[
        Case(
            f"count{flag[1:]}-{value}",
            lambda f, flag=flag, value=value: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, flag, value],
            2,
            (f"Expected {flag} >= 1, got {value}",),
            built=(),
            kind="bad-input",
        )
        for flag, value in COUNTS
    ],
    # outputs: every path checked before any work
    Case(
        "unwritable-json",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--json", "afile/r.json"],
        2,
        ("--json 'afile/r.json' under a folder, got a file at", "afile'"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "unwritable-logdir",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--logdir", "afile/tb"],
        2,
        ("Expected --logdir 'afile/tb' under a folder, got a file at 'afile'",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "logdir-a-file",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--logdir", "afile"],
        2,
        ("Expected --logdir 'afile' to be a folder, got a file",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "unwritable-report",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--report", "afile/r.md"],
        2,
        ("--report 'afile/r.md' under a folder, got a file at", "afile'"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "json-is-a-folder",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--json", "."],
        2,
        ("Expected --json to name a file ending in .json or .jsonl, got '.' (a folder)",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "json-wrong-suffix",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--json", "r.txt"],
        2,
        ("Expected --json to end in .json or .jsonl, got 'r.txt'",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "report-wrong-suffix",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--report", "x.txt"],
        2,
        ("Expected --report to end in .md, got 'x.txt'",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "read-only-json",
        _read_only("r.json"),
        2,
        ("Expected --json 'r.json' to be writable, got a read-only file",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "read-only-report",
        _read_only("r.md"),
        2,
        ("Expected --report 'r.md' to be writable, got a read-only file",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "plot-path-a-folder",
        _blocked_plot,
        2,
        ("'out/r_saturation.png' is a folder, where its saturation plot goes",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "partial-path-a-folder",
        _partial_a_folder,
        2,
        ("'r.json.partial.jsonl' is a folder, where the file of partial",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "run-folder-a-file",
        _run_name_a_file,
        2,
        ("Expected --logdir/--name 'tb2/replay' to be a folder (the TensorBoard run folder goes there), got a file:",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "empty-name",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--name", ""],
        2,
        ("Expected --name to be a run name such as 'replay'", "got ''"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "name-escapes-logdir",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--name", "../up"],
        2,
        ("Expected --name to be a run name", "got '../up'"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "empty-logdir",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--logdir", ""],
        2,
        ("Expected --logdir to name a folder, got an empty name",),
        built=(),
        kind="bad-input",
    ),
    # the model on the first checkpoint, built on the meta device
    Case(
        "wrong-model",
        lambda f: [f.run_folder(3), "--model", WRONG, "--data", "calib.pt"],
        2,
        (
            f"--model {WRONG} does not build the checkpoints' model: step-2.ckpt (nor any of the other 2)",
            "shape(s) differ (model.tok_emb.weight: checkpoint [256, 32], model [256, 48]",
            "Is --model/--factory",
        ),
        built=("meta",),
        kind="bad-input",
    ),
    Case(
        "wrong-factory",
        lambda f: [f.plain("w.pt"), "--factory", "torch.nn:Identity", "--data", "calib.pt"],
        2,
        ("--factory torch.nn:Identity does not build the checkpoints' model: w.pt", "keys not in the model"),
        kind="bad-input",
    ),
    Case(
        "huge-model-hparams",
        lambda f: [f.ckpt("big.ckpt", _big), "--model", RECORDER, "--data", "calib.pt"],
        2,
        ("308 of the model's 342 keys missing from the checkpoint", "model [256, 2048]"),
        built=("meta",),
        kind="bad-input",
    ),
    Case(
        "deep-nested-hparams",
        _deep_hparams,
        2,
        (
            "--datamodule CorpusDataModule(**{'seq_len': 16, 'blob': [[...]]}) failed",
            "unexpected keyword argument 'blob'",
        ),
        built=("meta",),
        kind="bad-input",
    ),
    # nothing to replay: what was found instead
    Case(
        "only-the-data-file",
        _only("calib.pt"),
        2,
        ("Nothing to replay under 'd'", "found calib.pt (the --data file)"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "only-trainer-state",
        _only("optimizer.pt", "rng_state.pth", "notes.txt"),
        2,
        ("Nothing to replay under 'd'", "notes.txt (not .ckpt", "optimizer.pt (Trainer state, not model weights)"),
        built=(),
        kind="bad-input",
        absent=NO_TRUST,
    ),
    Case(
        "empty-folder",
        _only(),
        2,
        ("Nothing to replay under 'd'", "found nothing (empty folders)"),
        built=(),
        kind="bad-input",
    ),
    # inputs that change underneath, symlinks, folders of other tools
    Case(
        "truncated-mid-replay",
        _mutated("truncate"),
        1,
        ("step-6.ckpt: changed since it was listed (size", "Replayed 3 of 4"),
        built=("meta", "cpu", "cpu"),
        absent=("NON-FINITE", "Bus error"),
    ),
    Case(
        "rewritten-in-place-mid-replay",
        _mutated("rewrite"),
        1,
        ("step-6.ckpt: changed since it was listed (modified", "Replayed 3 of 4"),
        built=("meta", "cpu", "cpu"),
        absent=("NON-FINITE", "non-finite (NaN"),
    ),
    # one model per architecture (replay loads each checkpoint's weights into it); a checkpoint that cannot be
    # read drops it, so the next one is read by a model built afresh
    Case("symlinked-checkpoints-folder", _symlinked_checkpoints, 0, ("Replayed 4 of 4",), built=("meta", "cpu")),
    Case("temporary-name-taken", _temporary_name_taken, 0, ("Replayed 1 of 1", "JSON records:")),
    Case("hugging-face-folder", _hf_folder, 0, ("Replayed 2 of 2",), absent=NO_TRUST + ("rng_state", "optimizer.pt")),
    # files that are not what they say, diverged runs, other faults
    Case(
        "text-file-in-folder",
        _text_in_folder,
        1,
        ("skipped ckpts/notes.ckpt: not a PyTorch checkpoint: a text file (starts 'trained 2 steps, lr 3e-3')",),
    ),
    Case(
        "datamodule-seq-len-0",
        _seq_len_zero,
        2,
        ("--datamodule CorpusDataModule(**{'seq_len': 0", "ZeroDivisionError", "Pass --data FILE"),
        kind="bad-input",
    ),
    Case(
        "nan-weights",
        lambda f: [f.ckpt("nan.ckpt", _nan), *DATA],
        3,
        ("NON-FINITE", "| non-finite", "96 weights", "exit code 3"),
    ),
    Case(
        "inf-embeddings",
        lambda f: [f.ckpt("inf.ckpt", _inf_embedding), *DATA],
        3,
        ("NON-FINITE", "8,192 weights", "DyT inputs", "exit code 3"),
    ),
    Case(
        "file-path-factory",
        lambda f: [f.plain("w.pt"), "--factory", "./mymodels.py:build", "--data", "calib.pt"],
        0,
        ("Replayed 1 of 1",),
    ),
    Case("lookalike-modules-in-cwd", _lookalike_modules, 0, ("Replayed 1 of 1",), console_script=True),
    # round 4 (issue 30): damaged files, files that are not files, what cannot be read, literal paths, sys.path
    Case(
        "corrupt-tensor-bytes",
        _corrupt_tensor,
        1,
        ("skipped ckpts/bad.ckpt: corrupt: the bytes of 1 tensor record(s) (data/", "CRC-32", "Replayed 1 of 2"),
        built=("meta", "cpu"),
        last=r"^satmon replay: incomplete: 1 of 2 checkpoint\(s\) replayed; 1 skipped\.$",
    ),
    Case(
        "corrupt-pickle-bytes",
        _corrupt_pickle,
        1,
        ("skipped ckpts/bad.ckpt: corrupt: the bytes of its record", "data.pkl", "Replayed 1 of 2"),
        last=r"^satmon replay: incomplete: 1 of 2",
    ),
    Case(
        "safetensors-without-checksum",
        _damaged_safetensors,
        0,
        (
            "Replayed 1 of 1",
            "1 checkpoint(s) record no checksum (w.safetensors",
            "damaged bytes in them cannot be detected",
        ),
    ),
    Case(
        "legacy-file-without-checksum",
        _legacy_file,
        0,
        ("Replayed 1 of 1", "1 checkpoint(s) record no checksum (old.pt"),
    ),
    Case(
        "unreadable-folder",
        _no_permission("folder"),
        1,
        ("not replayed: ckpts/locked: cannot read the folder: Permission denied", "Replayed 2 of 2"),
        last=r"^satmon replay: incomplete: 2 of 2 checkpoint\(s\) replayed; 1 file\(s\) or folder\(s\) that may hold "
        r"checkpoints could not be read: ckpts/locked \(cannot read the folder: Permission denied\)\.$",
    ),
    Case(
        "unsearchable-folder",
        _no_permission("search"),
        1,
        ("not replayed: ckpts/locked/step-6.ckpt: cannot stat it: Permission denied", "Replayed 2 of 2"),
        last=r"^satmon replay: incomplete: .*could not be read: ckpts/locked/step-6.ckpt \(cannot stat it",
    ),
    Case(
        "unreadable-file",
        _no_permission("file"),
        1,
        ("skipped ckpts/step-4.ckpt: cannot read it: PermissionError",),
        last=r"^satmon replay: incomplete: 1 of 2 checkpoint\(s\) replayed; 1 skipped\.$",
    ),
    Case(
        "fifo-in-folder",
        _special("fifo-in-folder"),
        0,
        ("not replayed: ckpts/step-4.ckpt: a FIFO (named pipe): not read.", "Replayed 1 of 1"),
    ),
    Case(
        "socket-in-folder",
        _special("socket-in-folder"),
        0,
        ("not replayed: ckpts/s.ckpt: a socket: not read.", "Replayed 1 of 1"),
    ),
    Case(
        "link-to-dev-zero-in-folder",
        _special("dev-zero-link"),
        0,
        ("not replayed: ckpts/step-4.ckpt: a symlink to a character device (/dev/zero): not read.", "Replayed 1 of 1"),
    ),
    Case(
        "huge-sparse-file",
        _special("huge-sparse"),
        1,
        ("skipped ckpts/step-4.ckpt: not a PyTorch checkpoint: neither a torch.save zip archive nor a pickle",),
        last=r"^satmon replay: incomplete: 1 of 2",
    ),
    Case(
        "fifo-given",
        _special("fifo-given"),
        2,
        ("got 'p.ckpt', which is a FIFO (named pipe): pass the checkpoints' files or folder (it was not opened).",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "dev-zero-given",
        _special("dev-zero-given"),
        2,
        ("got '/dev/zero', which is a character device",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "escape-sequences-in-names",
        _escapes_in_names,
        1,
        (
            "step-2\\x1b[2J\\x1b]0;pwned\\x07.ckpt",
            "\\x1b]52;c;",
            "step-6\\x9b2J\\x0dGO \\u202egnp.ckpt",
            "skipped ckpts/notes\\x1b[32m.ckpt: not a PyTorch checkpoint",
            "Replayed 3 of 4",
        ),
        last=r"^satmon replay: incomplete: 3 of 4",
    ),
    Case("paths-used-literally", _literal, 0, ("Replayed 1 of 1",), check=_literal_check),
    Case(
        "safetensors-with-a-tail",
        _safetensors_with_a_tail,
        1,
        ("skipped w.safetensors: corrupt safetensors file: 13 byte(s) after its last tensor",),
        last=r"^satmon replay: incomplete: 0 of 1",
    ),
    Case(
        "partial-name-links-to-a-user-file",
        _partial_links_to_a_user_file,
        0,
        ("Replayed 1 of 1", "note: r.json.partial.jsonl (the records of an earlier interrupted replay) is replaced"),
        check=_victims_untouched,
    ),
    Case(
        "data-file-is-the-json",
        _data_is_the_json,
        2,
        ("Expected --json to write another file than --data 'calib.json'",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "name-with-control-characters",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--name", "run\x1b]0;x\x07"],
        2,
        ("Expected --name to be a name without control characters", "got 'run\\x1b]0;x\\x07'"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "next-run-folder-a-file", _next_version_a_file, 0, ("Replayed 1 of 1", "version_2"), check=_next_version_check
    ),
    Case(
        "run-folder-links-out-of-logdir",
        _run_folder_links_out,
        2,
        ("Expected --name 'replay' to stay under --logdir", "(a symlink out of it)"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "threads-beyond-the-machine",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--threads", "100000"],
        2,
        (f"Expected --threads in [1, {os.cpu_count()}] (the CPUs of this machine), got 100000.",),
        built=(),
        kind="bad-input",
    ),
    Case(
        "weights-only-and-trust",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--weights-only"],
        2,
        ("Expected either --weights-only", "or --trust-checkpoints", "got both"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "json-companion-too-long",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--json", "r" * 230 + ".json"],
        2,
        ("Expected --json's the file of partial records to name a file of at most 241 bytes", "got 249 bytes"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "report-plot-name-too-long",
        lambda f: [f.ckpt("p.ckpt", payload=Payload), *DATA_TRUSTED, "--report", "r" * 230 + ".md"],
        2,
        ("Expected --report's its saturation plot to name a file of at most 241 bytes", "got 245 bytes"),
        built=(),
        kind="bad-input",
    ),
    Case(
        "empty-pythonpath-entry",
        _cwd_module(":{path}"),
        2,
        ("cannot import module 'mymodel'", IGNORED),
        console_script=True,
        kind="bad-input",
    ),
    Case(
        "dot-pythonpath-entry",
        _cwd_module(".:{path}"),
        2,
        ("cannot import module 'mymodel'", IGNORED),
        console_script=True,
        kind="bad-input",
    ),
    Case(
        "relative-pythonpath-entry",
        _cwd_module("rel:{path}"),
        2,
        ("cannot import module 'mymodel'", "/rel'", IGNORED),
        console_script=True,
        kind="bad-input",
    ),
    Case(
        "python-m-working-directory",
        _cwd_module("-m"),
        2,
        ("cannot import module 'mymodel'",),
        console_script=True,
        kind="bad-input",
    ),
]


def _console(argv: list[str], cwd: Path, pythonpath: str | None = None) -> tuple[int, str]:
    """The installed ``satmon`` command (``pythonpath="-m"``: ``python -m satmon.cli.main``) in a fresh process;
    ``pythonpath`` a template of $PYTHONPATH around ``{path}``, this worktree's entries."""
    exe = Path(sys.executable).parent / "satmon"
    if not exe.exists():
        pytest.skip("the `satmon` console script is not installed")
    path = [str(cwd / "site"), str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}  # never '' (the cwd)
    command = [str(exe)]
    if pythonpath == "-m":
        command = [sys.executable, "-m", "satmon.cli.main"]
    elif pythonpath is not None:
        env["PYTHONPATH"] = pythonpath.format(path=os.pathsep.join(path))
    done = subprocess.run(
        [*command, "replay", *argv, "--logdir", "tb", "--quiet"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault(case, world, tmp_path, monkeypatch, capsys):
    f = Folder(tmp_path, world)
    f.monkeypatch, f.pythonpath = monkeypatch, None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    err = ""
    try:
        argv = case.argv(f)
        if case.console_script:
            code, said = _console(argv, tmp_path, f.pythonpath)
        else:
            if "--logdir" not in argv:
                argv += ["--logdir", "tb"]
            code = main(["replay", *argv, "--quiet"])
            out, err = capsys.readouterr()
            said = out + err
            if code == 2:
                assert len(err.strip().splitlines()) == 1, err  # a usage error is one line, no traceback
    finally:
        os.environ.pop("SATMON_TEST_MUTATE", None)
        monkeypatch.undo()  # os.scandir and os.open as they were, before the folder is looked at
    assert code == case.exit, said
    if case.last is not None:
        assert re.search(case.last, err.strip().splitlines()[-1]), err
    if case.check is not None:
        case.check(tmp_path)
    assert all(c.isprintable() or c in "\n\t" for c in said), "a control character reached the console"
    assert (case.kind == "bad-input") == (case.exit == 2), "a refusal is a bad input, and only a refusal"
    for text in case.said:
        assert text in said, said
    for text in case.absent:
        assert text not in said, said
    assert "Traceback" not in said
    assert f.runs == case.runs, f"payload ran {f.runs} time(s)"
    if case.built is not None:
        assert f.built == case.built, f"the model class was built {f.built}"
    if case.exit == 2:  # nothing was written: no TensorBoard run, no partial records, no temporary file
        assert not (tmp_path / "tb").exists() and not (tmp_path / "tb2" / "replay" / "version_0").exists()
        assert not [p for p in tmp_path.rglob("*.partial.jsonl") if p.is_file()]
        assert not list(tmp_path.rglob(".*.tmp"))
    if case.id == "temporary-name-taken":
        assert (tmp_path / "r.json.tmp").is_dir() and len(json.loads((tmp_path / "r.json").read_text())) == 1
    for name in ("r.json", "r.md"):
        if case.id == f"read-only-{name.split('.')[1].replace('md', 'report')}":  # left as it was
            assert (tmp_path / name).read_text() in ("[]\n", "# previous report\n")


# --- outputs that never lose what was there: interrupts, kills, complete runs ---
def _complete_previous(tmp_path: Path, folder: str) -> bytes:
    """A complete replay of ``folder`` into prev.json: the file an interrupted replay must leave as it is."""
    code = main(["replay", folder, *DATA, "--logdir", "tb", "--json", "prev.json", "--quiet"])
    assert code == 0
    os.chmod(tmp_path / "prev.json", 0o640)
    return (tmp_path / "prev.json").read_bytes()


def _replay_until(tmp_path: Path, folder: str, sig: int, after: int) -> tuple[int, str, str]:
    """``satmon replay`` in a subprocess, sent ``sig`` once ``after`` checkpoints were reported."""
    cmd = [
        sys.executable,
        "-m",
        "satmon.cli.main",
        "replay",
        folder,
        *DATA,
        "--logdir",
        "tb",
        "--json",
        "prev.json",
        "--threads",
        "1",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *(p for p in sys.path if p)]),
        "OMP_NUM_THREADS": "1",
    }
    proc = popen_as_from_a_terminal(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if sum(ln.startswith(("[", "satmon replay: [")) for ln in lines) == after:  # a progress line per checkpoint
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=300)
    return proc.returncode, "".join(lines) + out, err


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -9)],
    ids=["ctrl-c", "sigterm", "sigkill"],
)
def test_an_interrupted_replay_leaves_the_previous_json_untouched_and_keeps_its_records(
    world, tmp_path, monkeypatch, capsys, sig, code
):
    f = Folder(tmp_path, world)
    monkeypatch.chdir(tmp_path)
    folder = f.run_folder(12)
    before = _complete_previous(tmp_path, folder)
    capsys.readouterr()
    for i in range(12):  # other weights at the same steps: the new records differ from the previous ones
        f.ckpt(f"{folder}/step-{2 * (i + 1)}.ckpt", _nan if i % 2 else None, step=2 * (i + 1))
    got, _, err = _replay_until(tmp_path, folder, sig, after=3)
    assert got == code, err
    assert (tmp_path / "prev.json").read_bytes() == before  # complete records, untouched
    assert len(json.loads(before)) == 12 and stat.S_IMODE(os.stat(tmp_path / "prev.json").st_mode) == 0o640
    partial = [json.loads(line) for line in (tmp_path / "prev.json.partial.jsonl").read_text().splitlines()]
    assert 3 <= len(partial) < 12 and [r["global_step"] for r in partial] == [2 * (i + 1) for i in range(len(partial))]
    assert partial[1]["nonfinite_weights"] > 0  # the new run's records
    assert stat.S_IMODE(os.stat(tmp_path / "prev.json.partial.jsonl").st_mode) == 0o640  # as private as the target
    assert "Traceback" not in err and not list(tmp_path.glob(".prev.json.*.tmp"))
    if sig != signal.SIGKILL:
        last = err.strip().splitlines()[-1]
        how = "interrupted (Ctrl-C)" if sig == signal.SIGINT else "terminated (SIGTERM)"
        assert re.fullmatch(
            rf"satmon replay: {re.escape(how)} after \d+ of 12 checkpoint\(s\): prev.json was left as it "
            rf"was; the \d+ new record\(s\) are in prev.json.partial.jsonl; TensorBoard run .*version_1 "
            r"holds the checkpoints replayed so far\.",
            last,
        ), last


def test_a_complete_replay_replaces_the_json_once_keeps_its_permissions_and_says_so(
    world, tmp_path, monkeypatch, capsys
):
    from satmon.io import json_records

    f = Folder(tmp_path, world)
    monkeypatch.chdir(tmp_path)
    folder = f.run_folder(3)
    _complete_previous(tmp_path, folder)
    (tmp_path / "r.md").write_text("# previous report\n")
    os.chmod(tmp_path / "r.md", 0o600)
    capsys.readouterr()
    writes = []
    real = json_records.write_records
    monkeypatch.setattr(json_records, "write_records", lambda *a, **k: writes.append(a[0]) or real(*a, **k))
    code = main(["replay", folder, *DATA, "--logdir", "tb", "--json", "prev.json", "--report", "r.md", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert writes == [Path("prev.json")]  # once, at the end (0.2 rewrote it after each checkpoint)
    assert (
        len(json.loads((tmp_path / "prev.json").read_text())) == 3
        and not (tmp_path / "prev.json.partial.jsonl").exists()
    )
    assert stat.S_IMODE(os.stat(tmp_path / "prev.json").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "r.md").st_mode) == 0o600 and (tmp_path / "r.md").read_text().startswith(
        "# satmon"
    )
    assert out.count("replaced the previous file; its permissions kept") == 1
    assert out.count("replaced 1 previous file(s), their permissions kept") == 1


def test_a_full_disk_mid_replay_stops_in_one_line_and_leaves_the_previous_json(world, tmp_path, monkeypatch, capsys):
    import errno

    from satmon.io.jsonl import PartialRecords

    f = Folder(tmp_path, world)
    monkeypatch.chdir(tmp_path)
    folder = f.run_folder(4)
    before = _complete_previous(tmp_path, folder)
    capsys.readouterr()
    real = PartialRecords.add

    def add(self, record):
        if self.count == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real(self, record)

    monkeypatch.setattr(PartialRecords, "add", add)
    code = main(["replay", folder, *DATA, "--logdir", "tb", "--json", "prev.json", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and (tmp_path / "prev.json").read_bytes() == before
    assert err.strip().splitlines()[-1] == (
        "satmon replay: stopped by OSError: [Errno 28] No space left on device: 'prev.json.partial.jsonl' after 2 of 4 "
        "checkpoint(s): prev.json was left as it was; the 2 new record(s) are in "
        "prev.json.partial.jsonl; TensorBoard run "
        f"{tmp_path / 'tb' / 'replay' / 'version_1'} holds the checkpoints replayed so far."
    )


def test_a_full_disk_mid_record_leaves_the_partial_file_on_a_complete_record(world, tmp_path, monkeypatch, capsys):
    """0.2: the disk filled up in the middle of a record and the partial file ended with half of it."""
    import errno

    from satmon.io import jsonl

    f = Folder(tmp_path, world)
    monkeypatch.chdir(tmp_path)
    folder = f.run_folder(4)
    real_write, calls = os.write, []

    def write(fd, data):
        # the third record: half fits, then the disk is full
        if calls or (len(data) > 200 and b'"global_step": 6' in data):
            calls.append(len(data))
            if len(calls) == 1:
                return real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(jsonl.os, "write", write)
    code = main(["replay", folder, *DATA, "--logdir", "tb", "--json", "r.json", "--quiet"])
    err = capsys.readouterr().err
    monkeypatch.undo()
    assert code == 1 and calls, err
    text = (tmp_path / "r.json.partial.jsonl").read_text()
    assert text.endswith("\n"), text
    assert [json.loads(line)["global_step"] for line in text.splitlines()] == [2, 4]  # complete records only
    assert (
        err.strip().splitlines()[-1].startswith("satmon replay: stopped by OSError: [Errno 28] No space left on device")
    )
    assert "the 2 new record(s) are in r.json.partial.jsonl" in err and "Traceback" not in err


def test_a_writer_thread_that_fails_reaches_the_one_line_message(world, tmp_path, monkeypatch, capsys):
    """0.2: a full disk under --logdir gave the one-line message, then TensorBoard's writer
    thread's 48-line traceback."""
    import errno

    from tensorboard.summary.writer import record_writer

    f = Folder(tmp_path, world)
    monkeypatch.chdir(tmp_path)
    folder = f.run_folder(3)

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    code = main(["replay", folder, *DATA, "--logdir", "tb", "--json", "r.json", "--quiet"])
    out, err = capsys.readouterr()
    monkeypatch.undo()
    assert code == 1 and "Traceback" not in out + err and "Exception in thread" not in err, err
    assert len(err.strip().splitlines()) == 1 and "No space left on device" in err, err
    assert err.startswith("satmon replay: stopped by OSError: [Errno 28] No space left on device after ")
    assert not (tmp_path / "r.json").exists()


def test_a_refused_replay_leaves_no_empty_tensorboard_run(world, tmp_path, monkeypatch, capsys):
    f = Folder(tmp_path, world)
    monkeypatch.chdir(tmp_path)
    for argv in (
        [f.run_folder(2), "--model", WRONG, "--data", "calib.pt"],
        [f.ckpt("a.ckpt"), *DATA, "--threshold", "2"],
        [f.ckpt("b.ckpt"), *DATA, "--name", " "],
    ):
        assert main(["replay", *argv, "--logdir", "tb"]) == 2
    assert main(["replay", "afile", "recorder.py", *DATA, "--logdir", "tb"]) == 1  # nothing readable: skipped, no run
    assert "no checkpoint could be read" in capsys.readouterr().out
    assert not (tmp_path / "tb").exists()


def test_reliability_figures_are_the_matrix():
    """docs/reference/reliability.md's figures are counted from these tables, so they stay true."""
    text = (ROOT / "docs" / "reference" / "reliability.md").read_text()
    bad = [c for c in CASES if c.kind == "bad-input"]
    faults = [c for c in CASES if c.kind == "fault"]
    # test_an_interrupted_replay_...: Ctrl-C, SIGTERM, SIGKILL; test_a_full_disk_mid_replay_..., _mid_record_...;
    # test_a_writer_thread_that_fails_...
    interrupts = 6
    want = {
        "bad inputs tried": len(bad),
        "clear errors": len(bad),
        "faults survived": len(faults) + interrupts,
        "data lost": 0,
    }
    for label, value in want.items():
        found = re.search(rf"\*\*{label}\*\*: (\d+)", text)
        assert found and int(found.group(1)) == value, (label, value, found and found.group(0))


# --- training: non-finite values, resume, constructor input ---
class _NaNLossAt(type(tiny_lit())):
    """The training loss turns NaN at one optimizer step (its gradient stays finite)."""

    at = 3

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss + (float("nan") - loss.detach()) if self.global_step == self.at else loss


class _NaNGradientAt(_NaNLossAt):
    """The loss and its gradient turn NaN at one step: the optimizer makes the weights NaN (a diverged run)."""

    def training_step(self, batch, batch_idx):
        loss = type(tiny_lit()).training_step(self, batch, batch_idx)
        return loss * float("nan") if self.global_step == self.at else loss


def _nan_model(kind: type = _NaNLossAt):
    return kind(arch="gpt", d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=2.0, lr=3e-3, warmup=1)


@pytest.mark.parametrize("abort_on", ["any", "no-go", "collapse", "never"])
def test_nonfinite_loss_in_the_window_stops_within_one_step_only_when_asked(tmp_path, abort_on):
    from satmon import SaturationMonitor

    monitor = SaturationMonitor(window=20, abort_on=abort_on, verbose=False)
    t = trainer(tmp_path, max_steps=8, callbacks=[monitor])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.fit(_nan_model(), token_loader(8))
    if abort_on == "any":  # 0.1 ran on to the end of the window and stopped with reason "no-go"
        assert monitor.stop.reason.value == "nonfinite" and monitor.stop.step == _NaNLossAt.at + 1
        assert t.global_step == _NaNLossAt.at + 1
    else:
        assert monitor.stop is None and t.global_step == 8


def test_nonfinite_inputs_in_the_window_give_a_nonfinite_verdict_not_no_go(tmp_path):
    from satmon import SaturationMonitor

    monitor = SaturationMonitor(window=6, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(tmp_path, max_steps=6, callbacks=[monitor]).fit(_nan_model(_NaNGradientAt), token_loader(6))
    v = monitor.verdict  # the NaN gradient made the weights NaN: every later DyT input is NaN (0.1 said NO-GO)
    assert (
        v.decision == "non-finite" and v.nonfinite > 0 and "NON-FINITE" in v.card() and "LayerNorm" not in v.headline()
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"include": 123}, "Expected `include`"),
        ({"exclude": ["a"]}, "Expected `exclude`"),
        ({"include": "(unclosed"}, "valid regular expression"),
        ({"dry_run": "yes"}, "Expected `dry_run` to be True or False"),
        ({"verbose": "no"}, "Expected `verbose` to be True or False"),
        ({"window": True}, "Expected `window`"),
        ({"product": "rounded"}, "Expected `product`"),
        ({"offset_every": -1}, "Expected `offset_every`"),
        ({"on_missing": "ignore"}, "Expected `on_missing`"),
        ({"gating_mapping": ["a"]}, "Expected `gating_mapping`"),
        # round 4: accepted by 0.2, then a bare TypeError at fit, or 400 GB allocated at the window's end
        (
            {"include": lambda module: True},
            r"Expected `include` to be a predicate called as include\(name, module\) -> bool, "
            r"got <lambda>\(module\), which cannot take those two arguments",
        ),
        (
            {"exclude": torch.nn.LayerNorm},
            r"got the class LayerNorm: to select modules by type pass exclude=lambda name, "
            r"module: isinstance\(module, LayerNorm\)",
        ),
        (
            {"loss_baseline": 10**11},
            r"Expected `loss_baseline` to be an int in \[2, 1000000\] \(steps of training loss kept "
            r"on the device for the spike baseline\), got 100000000000",
        ),
        ({"watch_every_n_steps": 10**12}, r"Expected `watch_every_n_steps` to be an int in \[0, 1000000\]"),
    ],
)
def test_bad_constructor_arguments_fail_at_construction_with_what_to_do(kwargs, match):
    from satmon import SaturationMonitor

    with pytest.raises(ValueError, match=match):  # 0.1 accepted include=123 until fit, dry_run="yes", verbose="no"
        SaturationMonitor(**kwargs)


# --- distributed ---
UNEVEN_DDP_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import torch
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, Subset
    from helpers import tiny_lit, token_loader, trainer
    from satmon import SaturationMonitor

    with_satmon, out = sys.argv[1] == "1", sys.argv[2]
    torch.set_num_threads(1)


    class Uneven(pl.LightningDataModule):
        # rank 0 gets 5 batches, rank 1 gets 4: a custom split Lightning does not pad
        def train_dataloader(self):
            data = token_loader(n_batches=9, batch_size=2).dataset
            rank = self.trainer.global_rank
            idx = range(0, 10) if rank == 0 else range(10, 18)
            return DataLoader(Subset(data, list(idx)), batch_size=2, shuffle=False)


    monitor = SaturationMonitor(window=50, verbose=False)
    callbacks = [monitor] if with_satmon else []
    tr = trainer(out, devices=2, strategy="ddp", num_nodes=1, max_epochs=1, callbacks=callbacks,
                 use_distributed_sampler=False)
    try:
        tr.fit(tiny_lit(alpha_init=2.0), datamodule=Uneven())
        status = "finished"
    except Exception as e:  # what Lightning/gloo raise is theirs; satmon must not turn it into a hang
        status = "error: " + type(e).__name__
    verdict = monitor.verdict.to_dict() if with_satmon and monitor.verdict else None
    with open(os.path.join(out, f"rank-{{tr.global_rank}}.json"), "w") as f:
        json.dump(dict(status=status, verdict=verdict, steps=tr.global_step), f)
    """
)


def _run_uneven_ddp(tmp_path: Path, with_satmon: bool, timeout: float) -> tuple[float, bool]:
    out = tmp_path / ("satmon" if with_satmon else "baseline")
    out.mkdir()
    script = out / "run.py"
    script.write_text(UNEVEN_DDP_SCRIPT.format(tests=str(Path(__file__).resolve().parent)))
    env = {
        **os.environ,
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "TORCH_GLOO_TIMEOUT": "30",
    }
    for var in ("MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "PL_GLOBAL_SEED"):
        env.pop(var, None)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(script), "1" if with_satmon else "0", str(out)],
        cwd=str(out),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=timeout)
        return time.monotonic() - start, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return time.monotonic() - start, True


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="needs gloo"
)
def test_ddp_uneven_batches_do_not_hang_with_satmon(tmp_path):
    """Two ranks with 5 and 4 batches, training shorter than the window: 0.1 hung in its end-of-training sync."""
    baseline, baseline_hung = _run_uneven_ddp(tmp_path, with_satmon=False, timeout=150)
    assert not baseline_hung, "the run without satmon did not end: the scenario itself hangs on this machine"
    took, hung = _run_uneven_ddp(tmp_path, with_satmon=True, timeout=max(90.0, 3 * baseline))
    assert not hung, f"satmon's run hung (killed after {took:.0f} s; without satmon it ended in {baseline:.0f} s)"
