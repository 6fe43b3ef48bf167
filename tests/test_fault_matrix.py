"""The fault matrix: what satmon does under each hostile or unlucky input, one asserted outcome per case
(docs/reliability.md points here). Every case asserts the exit code, what the user is told, and that
no code from a file ran unless asked for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
import time
import textwrap
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
    assert v.decision == "non-finite" and v.nonfinite > 0 and "NON-FINITE" in v.card() and "LayerNorm" not in v.headline()


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"include": 123}, "Expected `include`"), ({"exclude": ["a"]}, "Expected `exclude`"),
    ({"include": "(unclosed"}, "valid regular expression"), ({"dry_run": "yes"}, "Expected `dry_run` to be True or False"),
    ({"verbose": "no"}, "Expected `verbose` to be True or False"), ({"window": True}, "Expected `window`"),
    ({"product": "rounded"}, "Expected `product`"), ({"offset_every": -1}, "Expected `offset_every`"),
    ({"on_missing": "ignore"}, "Expected `on_missing`"), ({"gating_mapping": ["a"]}, "Expected `gating_mapping`"),
])
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
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "TORCH_GLOO_TIMEOUT": "30"}
    for var in ("MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "PL_GLOBAL_SEED"):
        env.pop(var, None)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script), "1" if with_satmon else "0", str(out)], cwd=str(out), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
        return time.monotonic() - start, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return time.monotonic() - start, True


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="needs gloo")
def test_ddp_uneven_batches_do_not_hang_with_satmon(tmp_path):
    """Two ranks with 5 and 4 batches, training shorter than the window: 0.1 hung in its end-of-training sync."""
    baseline, baseline_hung = _run_uneven_ddp(tmp_path, with_satmon=False, timeout=150)
    assert not baseline_hung, "the run without satmon did not end: the scenario itself hangs on this machine"
    took, hung = _run_uneven_ddp(tmp_path, with_satmon=True, timeout=max(90.0, 3 * baseline))
    assert not hung, f"satmon's run hung (killed after {took:.0f} s; without satmon it ended in {baseline:.0f} s)"
