"""The fault matrix: what satmon does under each hostile or unlucky input, one asserted outcome per case
(docs/reliability.md points here). Every case asserts the exit code, what the user is told, and that
no code from a file ran unless asked for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import tiny_lit, token_loader, trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from satmon.cli.main import main

# --- security and replay input ---
MODEL = "satmon.demos.lit:LitLM"
FACTORY_SRC = ("from satmon.demos.gpt import GPT, GPTConfig\n"
               "def build():\n    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16))\n")


class Payload:
    """Unpickling this runs ``exec``: one line appended to ``marker`` per load (the evidence that code from a file ran)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'a').write('ran\\n')",)


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
    """One case's working folder: files to replay and the payload marker."""

    def __init__(self, tmp: Path, world: dict) -> None:
        self.tmp, self.world, self.marker = tmp, world, tmp / "payload_ran"
        shutil.copy(world["calib"], tmp / "calib.pt")
        (tmp / "mymodels.py").write_text(FACTORY_SRC)
        (tmp / "afile").write_text("not a folder")

    def ckpt(self, name: str, edit: Callable[[dict], None] | None = None, payload: bool = False) -> str:
        ckpt = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.world["ckpt"].items()}
        if edit is not None:
            edit(ckpt)
        if payload:
            ckpt["user_extra"] = Payload(self.marker)
        (self.tmp / name).parent.mkdir(parents=True, exist_ok=True)
        torch.save(ckpt, self.tmp / name)
        return name

    def plain(self, name: str, payload: bool = False) -> str:
        sd = {k.removeprefix("model."): v for k, v in self.world["ckpt"]["state_dict"].items()}
        torch.save({"model": sd, "iter_num": 2, **({"x": Payload(self.marker)} if payload else {})}, self.tmp / name)
        return name

    @property
    def runs(self) -> int:
        return len(self.marker.read_text().splitlines()) if self.marker.exists() else 0


def _nan(ckpt: dict) -> None:
    w = ckpt["state_dict"]["model.blocks.0.attn.c_attn.weight"].clone()
    w[:, 0] = float("nan")
    ckpt["state_dict"]["model.blocks.0.attn.c_attn.weight"] = w


def _inf_embedding(ckpt: dict) -> None:
    e = torch.full_like(ckpt["state_dict"]["model.tok_emb.weight"], float("inf"))
    ckpt["state_dict"]["model.tok_emb.weight"] = ckpt["state_dict"]["model.lm_head.weight"] = e  # tied weights


def _text_in_folder(f: Folder) -> list[str]:
    f.ckpt("ckpts/good.ckpt")
    (f.tmp / "ckpts" / "notes.ckpt").write_text("trained 2 steps, lr 3e-3\n")
    return ["ckpts", "--model", MODEL, "--data", "calib.pt"]


def _seq_len_zero(f: Folder) -> list[str]:
    hp = dict(seq_len=0, batch_size=4, train_tokens=20_000, val_tokens=2_000, seed=0)
    name = f.ckpt("dm.ckpt", lambda c: c.update(datamodule_hyper_parameters=hp))
    return [name, "--model", MODEL, "--datamodule", "satmon.demos.corpus:CorpusDataModule"]


def _lookalike_modules(f: Folder) -> list[str]:
    """An installed user package whose dependency has a look-alike in the working directory, and a
    ``tensorboard.py`` there too: none of the working directory's files may run."""
    site = f.tmp / "site"
    (site / "userpkg_fm").mkdir(parents=True)
    (site / "satmon_dep_fm.py").write_text("OK = True\n")
    (site / "userpkg_fm" / "__init__.py").write_text("import satmon_dep_fm\nfrom satmon.demos.lit import LitLM as Lit\n")
    for shadow in ("satmon_dep_fm.py", "tensorboard.py", "matplotlib.py"):
        (f.tmp / shadow).write_text(f"open({str(f.marker)!r}, 'a').write('{shadow}\\n')\n")
    return [f.ckpt("a.ckpt"), "--model", "userpkg_fm:Lit", "--data", "calib.pt", "--report", "r.md"]


@dataclass
class Case:
    id: str
    argv: Callable[[Folder], list[str]]
    exit: int
    said: tuple[str, ...] = ()  #: in stdout + stderr
    runs: int = 0  #: times the payload (or a look-alike module) ran
    console_script: bool = False  #: run the installed ``satmon`` command (its own sys.path), not main()


DATA = ["--model", MODEL, "--data", "calib.pt"]
CASES = [
    Case("payload-ckpt-refused", lambda f: [f.ckpt("p.ckpt", payload=True), *DATA], 1,
         ("skipped p.ckpt", "refused by torch.load(weights_only=True)", "GLOBAL exec", "--trust-checkpoints")),
    Case("payload-pt-refused", lambda f: [f.plain("p.pt", payload=True), "--factory", "mymodels.py:build", "--data", "calib.pt"],
         1, ("p.pt", "--trust-checkpoints")),
    Case("payload-then-usage-error", lambda f: [f.ckpt("p.ckpt", payload=True), "--model", MODEL, "--datamodule",
                                                "satmon.demos.corpus:Nope"], 2, ("has no attribute 'Nope'",)),
    Case("payload-trusted-then-usage-error", lambda f: [f.ckpt("p.ckpt", payload=True), "--trust-checkpoints", "--model",
                                                        "satmon.demos.lit:build_model", "--data", "calib.pt"],
         2, ("expected a LightningModule class",)),
    Case("payload-trusted-loads-once", lambda f: [f.ckpt("p.ckpt", payload=True), *DATA, "--trust-checkpoints"], 0,
         ("Replayed 1 of 1", "runs code stored in them"), runs=1),
    Case("unwritable-json", lambda f: [f.ckpt("p.ckpt", payload=True), *DATA, "--trust-checkpoints", "--json", "afile/r.json"],
         2, ("--json 'afile/r.json': cannot write there", "is a file, not a folder")),
    Case("unwritable-logdir", lambda f: [f.ckpt("p.ckpt", payload=True), *DATA, "--trust-checkpoints", "--logdir", "afile/tb"],
         2, ("--logdir 'afile/tb': cannot write there",)),
    Case("unwritable-report", lambda f: [f.ckpt("p.ckpt", payload=True), *DATA, "--trust-checkpoints", "--report", "afile/r.md"],
         2, ("--report 'afile/r.md': cannot write there",)),
    Case("json-is-a-folder", lambda f: [f.ckpt("a.ckpt"), *DATA, "--json", "."], 2, ("expected a file, got a folder",)),
    Case("text-file-in-folder", _text_in_folder, 1,
         ("skipped ckpts/notes.ckpt: not a PyTorch checkpoint: a text file (starts 'trained 2 steps, lr 3e-3')",)),
    Case("datamodule-seq-len-0", _seq_len_zero, 2,
         ("--datamodule CorpusDataModule(**{'seq_len': 0", "ZeroDivisionError", "Pass --data FILE")),
    Case("nan-weights", lambda f: [f.ckpt("nan.ckpt", _nan), *DATA], 3,
         ("NON-FINITE", "| non-finite", "96 weights", "exit code 3")),
    Case("inf-embeddings", lambda f: [f.ckpt("inf.ckpt", _inf_embedding), *DATA], 3,
         ("NON-FINITE", "8,192 weights", "DyT inputs", "exit code 3")),
    Case("file-path-factory", lambda f: [f.plain("w.pt"), "--factory", "./mymodels.py:build", "--data", "calib.pt"], 0,
         ("Replayed 1 of 1",)),
    Case("lookalike-modules-in-cwd", _lookalike_modules, 0, ("Replayed 1 of 1",), console_script=True),
]


def _console(argv: list[str], cwd: Path) -> tuple[int, str]:
    exe = Path(sys.executable).parent / "satmon"
    if not exe.exists():
        pytest.skip("the `satmon` console script is not installed")
    env = {**os.environ, "PYTHONPATH": str(cwd / "site"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(exe), "replay", *argv, "--logdir", "tb", "--quiet"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault(case, world, tmp_path, monkeypatch, capsys):
    f = Folder(tmp_path, world)
    monkeypatch.chdir(tmp_path)
    argv = case.argv(f)
    if case.console_script:
        code, said = _console(argv, tmp_path)
    else:
        if "--logdir" not in argv:
            argv += ["--logdir", "tb"]
        code = main(["replay", *argv, "--quiet"])
        out, err = capsys.readouterr()
        said = out + err
        if code == 2:
            assert len(err.strip().splitlines()) == 1, err  # a usage error is one line
    assert code == case.exit, said
    for text in case.said:
        assert text in said, said
    assert f.runs == case.runs, f"payload ran {f.runs} time(s)"
    if case.exit == 2:
        assert not (tmp_path / "tb").exists()  # nothing was written either
