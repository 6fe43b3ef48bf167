"""``satmon replay``: a real training run's checkpoints, replayed and checked against an independent
float64 count, the live probe, TensorBoard, JSON and the markdown report; broken files; bad usage.
The faults (crafted pickles, unwritable outputs, non-finite checkpoints...) are in tests/test_fault_matrix.py."""

from __future__ import annotations

import fractions
import json
import shutil
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import tiny_lit
from satmon import SaturationMonitor, find_dyt_layers
from satmon.cli.main import main
from satmon.demos.corpus import CorpusDataModule

LEVEL = 0.5  # at the tiny model's scale |alpha x| > 2 is never reached; 0.5 spreads layers over 0 .. 0.9
MODEL = "satmon.demos.lit:LitLM"
DM_ARGS = dict(seq_len=16, batch_size=4, train_tokens=20_000, val_tokens=2_000, seed=0)
FACTORY_SRC = (
    "from satmon.demos.gpt import GPT, GPTConfig\n"
    "def build():\n    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16))\n"
)


def _calibration() -> list[tuple[torch.Tensor, torch.Tensor]]:
    dm = CorpusDataModule(**DM_ARGS)
    dm.setup("fit")
    return [b for _, b in zip(range(3), dm.train_dataloader())]


def _train(root, norm="dyt", steps=9, every=3, callbacks=()):
    pl.seed_everything(0, verbose=False)
    ckpt = ModelCheckpoint(dirpath=root / "ckpts", every_n_train_steps=every, save_top_k=-1)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[ckpt, *callbacks],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(tiny_lit(norm=norm, lr=1e-2), CorpusDataModule(**DM_ARGS))
    return root / "ckpts"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real run whose monitor probes at every checkpoint save; its calibration batches are saved for replay."""
    root = tmp_path_factory.mktemp("run")
    monitor = SaturationMonitor(window=9, level=LEVEL, probe_on_checkpoint=True, calibration_batches=3, verbose=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*no logger.*")
        ckpts = _train(root, callbacks=[monitor])
    torch.save(monitor.live_probe.batches, root / "calib.pt")
    # the file names must not decide the order: the step-3 checkpoint gets a name that sorts last
    (ckpts / "epoch=0-step=3.ckpt").rename(ckpts / "zz-first.ckpt")
    return root, ckpts, dict(monitor.live_probe.reports)


def _reference(ckpt_path, batches) -> dict[str, tuple[int, int]]:
    """Independent of satmon's counting code: record each DyT input, count |alpha x| > LEVEL in float64."""
    from satmon.demos.lit import LitLM

    model = LitLM.load_from_checkpoint(ckpt_path, map_location="cpu").eval()
    names = [l.name for l in find_dyt_layers(model)]
    modules = dict(model.named_modules())
    counts = {n: [0, 0] for n in names}

    def hook(name):
        def fn(mod, args, out):
            pre = mod.alpha.detach().double() * args[0].detach().double()
            counts[name][0] += int((pre.abs() > LEVEL).sum())
            counts[name][1] += pre.numel()

        return fn

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    with torch.no_grad():
        for x, _ in batches:
            model(x)
    for h in handles:
        h.remove()
    return {n: (s, t) for n, (s, t) in counts.items()}


def _replay(capsys, *args):
    code = main(["replay", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_replay_matches_float64_reference_and_tensorboard(run, tmp_path, capsys):
    root, ckpts, _ = run
    code, out, err = _replay(
        capsys,
        ckpts,
        "--model",
        MODEL,
        "--data",
        root / "calib.pt",
        "--level",
        LEVEL,
        "--logdir",
        tmp_path / "tb",
        "--json",
        tmp_path / "r.json",
    )
    assert code == 0, err
    records = json.loads((tmp_path / "r.json").read_text())
    assert [r["global_step"] for r in records] == [3, 6, 9]  # by the step inside the file, not the name
    assert records[0]["checkpoint"].endswith("zz-first.ckpt")
    batches = torch.load(root / "calib.pt")
    for rec in records:
        ref = _reference(rec["checkpoint"], batches)
        pooled = sum(s for s, _ in ref.values()) / sum(t for _, t in ref.values())
        assert rec["verdict"]["saturation"] == pytest.approx(pooled, abs=1e-12)
        assert rec["verdict"]["step"] == rec["global_step"] and rec["verdict"]["source"] == "replay"
        assert rec["weights_only"] is True and rec["nonfinite_weights"] == 0  # satmon's own checkpoints: no opt-in
        for name, (s, t) in ref.items():
            assert rec["layers"][name]["saturation"] == pytest.approx(s / t, abs=1e-12)
    assert 0.05 < records[-1]["verdict"]["saturation"] < 0.95  # a reading with something to compare

    acc = EventAccumulator(str(tmp_path / "tb" / "replay" / "version_0"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    sat = acc.Scalars("Satmon/saturation")
    assert [e.step for e in sat] == [3, 6, 9]
    assert [e.value for e in sat] == pytest.approx([r["verdict"]["saturation"] for r in records], abs=1e-6)
    assert [e.step for e in acc.Scalars("satmon_saturation/model.ln_f")] == [3, 6, 9]
    assert [e.step for e in acc.Scalars("satmon_sigma_min/min_ratio")] == [3, 6, 9]
    assert [e.step for e in acc.Tensors("satmon/verdict")] == [3, 6, 9]
    assert [e.step for e in acc.Tensors("satmon/verdict_checkpoint")] == [3, 6, 9]
    assert "| step" in out and "| non-finite" in out and "zz-first.ckpt" in out  # the console summary


def test_live_probe_and_replay_agree(run, tmp_path, capsys):
    root, ckpts, live = run
    code, _, err = _replay(
        capsys,
        ckpts / "epoch=0-step=6.ckpt",
        "--model",
        MODEL,
        "--data",
        root / "calib.pt",
        "--level",
        LEVEL,
        "--logdir",
        tmp_path,
        "--json",
        tmp_path / "r.json",
    )
    assert code == 0, err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    want = live[6].to_dict()  # SaturationMonitor(probe_on_checkpoint=True): the probe at the step-6 save
    assert rec["global_step"] == 6
    assert rec["saturation"] == want["saturation"]  # exact integer counts on the same weights and batches
    assert {n: v["saturation"] for n, v in rec["layers"].items()} == {
        n: v["saturation"] for n, v in want["layers"].items()
    }
    assert rec["sigma_min"]["blocks"] == want["sigma_min"]["blocks"]
    assert rec["sigma_min"]["values"] == pytest.approx(want["sigma_min"]["values"], rel=1e-9)
    assert rec["norm_type"] == want["norm_type"]


def test_corrupt_and_truncated_files_are_named_and_skipped(run, tmp_path, capsys):
    _, ckpts, _ = run
    folder = tmp_path / "mixed"
    shutil.copytree(ckpts, folder)
    (folder / "random.ckpt").write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    good = (folder / "epoch=0-step=6.ckpt").read_bytes()
    (folder / "truncated.ckpt").write_bytes(good[: len(good) // 2])
    code, out, err = _replay(
        capsys,
        folder,
        "--model",
        MODEL,
        "--datamodule",
        "satmon.demos.corpus:CorpusDataModule",
        "--batches",
        2,
        "--logdir",
        tmp_path / "tb",
        "--json",
        tmp_path / "r.json",
    )
    assert code == 1
    assert "random.ckpt" in err and "truncated.ckpt" in err and "truncated or corrupt" in err
    records = json.loads((tmp_path / "r.json").read_text())
    assert [r["global_step"] for r in records if "error" not in r] == [3, 6, 9]
    errors = {r["checkpoint"].rsplit("/", 1)[-1]: r["error"] for r in records if "error" in r}
    assert set(errors) == {"random.ckpt", "truncated.ckpt"} and all(errors.values())


def test_incompatible_checkpoint_is_skipped(run, tmp_path, capsys):
    _, ckpts, _ = run
    ckpt = torch.load(ckpts / "epoch=0-step=6.ckpt", weights_only=True)
    ckpt["state_dict"]["model.ln_f.alpha"] = torch.ones(3)  # wrong shape: load_state_dict refuses it
    torch.save(ckpt, tmp_path / "bad-shape.ckpt")
    shutil.copy(ckpts / "epoch=0-step=9.ckpt", tmp_path / "good.ckpt")
    code, _, err = _replay(
        capsys,
        tmp_path / "bad-shape.ckpt",
        tmp_path / "good.ckpt",
        "--model",
        MODEL,
        "--data",
        run[0] / "calib.pt",
        "--logdir",
        tmp_path / "tb",
        "--json",
        tmp_path / "r.json",
    )
    assert code == 1 and "bad-shape.ckpt" in err, err
    assert "1 shape(s) differ (model.ln_f.alpha: checkpoint [3], model [1])" in err, err
    records = json.loads((tmp_path / "r.json").read_text())
    assert [("error" in r, r["global_step"]) for r in records] == [(True, 6), (False, 9)]


def test_json_and_markdown_report_with_plots(tmp_path, capsys):
    # a LayerNorm model: alignment, null space and the init-gap twin, beside the DyT run's saturation plot
    ckpts = _train(tmp_path, norm="layernorm", steps=4, every=2)
    torch.save(_calibration(), tmp_path / "calib.pt")
    code, out, err = _replay(
        capsys,
        ckpts,
        "--model",
        MODEL,
        "--data",
        tmp_path / "calib.pt",
        "--logdir",
        tmp_path / "tb",
        "--json",
        tmp_path / "out" / "r.jsonl",
        "--report",
        tmp_path / "out" / "report.md",
    )
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "out" / "r.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in records] == [2, 4]
    for r in records:
        assert {"checkpoint", "global_step", "verdict", "layers", "sigma_min", "norm_type", "init_gap"} <= set(r)
        assert r["verdict"] is None and r["norm_type"] == "layernorm-like"
        assert all(
            v["kind"] == "layernorm" and v["alignment"] > 0.999 and v["null_dim"] == 1 for v in r["layers"].values()
        )
        assert set(r["init_gap"]) == set(r["layers"])
        assert r["sigma_min"]["blocks"][0] == "embedding" and len(r["sigma_min"]["ratios"]) == 3
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# satmon replay report") and "| step" in md and "layernorm-like" in md
    for png in ("report_sigma_min.png", "report_alignment.png"):
        assert f"]({png})" in md
        data = (tmp_path / "out" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024
    assert "no DyT layer" in md  # the saturation plot is left out, and the report says why


def test_dyt_report_has_saturation_plot_verdict_card_and_nonfinite_line(run, tmp_path, capsys):
    root, ckpts, _ = run
    folder = tmp_path / "ckpts"
    shutil.copytree(ckpts, folder)
    ckpt = torch.load(ckpts / "epoch=0-step=9.ckpt", weights_only=True)
    ckpt["state_dict"]["model.blocks.1.mlp.c_fc.weight"] = torch.full_like(
        ckpt["state_dict"]["model.blocks.1.mlp.c_fc.weight"], float("nan")
    )
    ckpt["global_step"] = 12
    torch.save(ckpt, folder / "diverged.ckpt")
    code, out, err = _replay(
        capsys,
        folder,
        "--model",
        MODEL,
        "--data",
        root / "calib.pt",
        "--level",
        LEVEL,
        "--logdir",
        tmp_path,
        "--report",
        tmp_path / "r.md",
        "--quiet",
    )
    assert code == 3, err
    md = (tmp_path / "r.md").read_text()
    data = (tmp_path / "r_saturation.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024
    assert "](r_saturation.png)" in md and "](r_sigma_min.png)" in md and "### satmon verdict: **NON-FINITE**" in md
    assert "Non-finite values (NaN/inf) in 1 replayed checkpoint(s): step 12 diverged.ckpt: 4,096 weights" in md
    assert "| 12   | diverged.ckpt" in out and "4,096 weights" in out


def test_custom_type_refused_by_default_and_loaded_with_trust(run, tmp_path, capsys):
    root, ckpts, _ = run
    ckpt = torch.load(ckpts / "epoch=0-step=6.ckpt", weights_only=True)
    ckpt["user_extra"] = fractions.Fraction(1, 3)  # not on torch's weights_only allow-list
    torch.save(ckpt, tmp_path / "pickled.ckpt")
    args = [
        tmp_path / "pickled.ckpt",
        "--model",
        MODEL,
        "--data",
        root / "calib.pt",
        "--logdir",
        tmp_path / "tb",
        "--json",
        tmp_path / "r.json",
    ]
    code, _, err = _replay(capsys, *args)
    assert code == 1 and "pickled.ckpt" in err and "GLOBAL fractions.Fraction" in err and "--trust-checkpoints" in err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    assert rec["global_step"] is None and "refused by torch.load(weights_only=True)" in rec["error"]
    code, _, err = _replay(capsys, *args, "--trust-checkpoints")
    assert code == 0, err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    assert rec["weights_only"] is False and rec["global_step"] == 6
    code, _, err = _replay(capsys, *args, "--weights-only")  # satmon 0.1's flag: now the default, accepted
    assert code == 1 and "--weights-only is the default" in err


def test_plain_state_dict_with_factory_file(run, tmp_path, capsys, monkeypatch):
    root, ckpts, _ = run
    ckpt = torch.load(ckpts / "epoch=0-step=9.ckpt", weights_only=True)
    torch.save(
        {"model": {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}, "iter_num": 9},
        tmp_path / "weights.pt",
    )
    (tmp_path / "mymodels.py").write_text(FACTORY_SRC)
    monkeypatch.chdir(tmp_path)
    code, _, err = _replay(capsys, "weights.pt", "--factory", "mymodels:build", "--data", root / "calib.pt")
    assert code == 2 and "--factory mymodels.py:build" in err  # the working directory is not searched: the way out
    code, _, err = _replay(
        capsys,
        "weights.pt",
        "--factory",
        "mymodels.py:build",
        "--data",
        root / "calib.pt",
        "--level",
        LEVEL,
        "--logdir",
        "tb",
        "--json",
        "r.json",
    )
    assert code == 0, err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    want = _reference(ckpts / "epoch=0-step=9.ckpt", torch.load(root / "calib.pt"))
    assert rec["global_step"] == 9
    assert rec["layers"]["ln_f"]["saturation"] == pytest.approx(
        want["model.ln_f"][0] / want["model.ln_f"][1], abs=1e-12
    )


def test_safetensors_with_factory_and_data_file_beside_it(run, tmp_path, capsys, monkeypatch):
    safetensors = pytest.importorskip("safetensors.torch")
    root, ckpts, _ = run
    ckpt = torch.load(ckpts / "epoch=0-step=6.ckpt", weights_only=True)
    safetensors.save_file(
        {
            k.removeprefix("model."): v.contiguous()
            for k, v in ckpt["state_dict"].items()
            if k != "model.lm_head.weight"
        },
        str(tmp_path / "w.safetensors"),
    )
    shutil.copy(root / "calib.pt", tmp_path / "calib.pt")  # in the replayed folder: must not be taken for a checkpoint
    (tmp_path / "mymodels2.py").write_text(FACTORY_SRC)
    monkeypatch.chdir(tmp_path)
    code, _, err = _replay(
        capsys, ".", "--factory", "mymodels2.py:build", "--data", "calib.pt", "--logdir", "tb", "--json", "r.json"
    )
    assert code == 0, err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    assert rec["checkpoint"].endswith("w.safetensors") and rec["global_step"] == 0  # no step in the file: its position
    assert any("no global step" in n for n in rec["notes"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "satmon.demos.lit"], "MODULE:ATTR"),
        (["--model", "no_such_module_xyz:Net"], "cannot import module 'no_such_module_xyz'"),
        (["--model", "satmon.demos.lit:NoSuchClass"], "has no attribute 'NoSuchClass'"),
        (["--model", "satmon.demos.lit:build_model"], "expected a LightningModule class"),
        (["--model", MODEL, "--data", "missing.pt"], "--data 'missing.pt': no such file"),
        (["--model", MODEL, "--no-data"], "No calibration data: pass --data FILE"),
        (["--data-only"], "Pass --model MODULE:CLASS"),
        (["--model", MODEL, "--datamodule", "satmon.demos.corpus:Nope"], "has no attribute 'Nope'"),
        (
            ["--model", MODEL, "--datamodule", "satmon.demos.corpus:corpus_tokens"],
            "expected a LightningDataModule class",
        ),
        (["--model", MODEL, "--batches", "0"], "Expected --batches >= 1, got 0"),
        (["--model", MODEL, "--batch-size", "0"], "Expected --batch-size >= 1, got 0"),
    ],
)
def test_usage_errors_exit_2_with_one_clear_message(run, tmp_path, capsys, args, message):
    root, ckpts, _ = run
    if "--no-data" in args:
        args = [a for a in args if a != "--no-data"]
    elif "--data-only" in args:
        args = ["--data", str(root / "calib.pt")]
    elif "--data" not in args and "--datamodule" not in args:
        args = args + ["--data", str(root / "calib.pt")]
    code, _, err = _replay(capsys, ckpts, *args, "--logdir", tmp_path)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_path_and_empty_dir_exit_2(tmp_path, capsys):
    torch.save(torch.zeros(2, 4, dtype=torch.long), tmp_path / "x.pt")
    code, _, err = _replay(capsys, tmp_path / "nope", "--model", MODEL, "--data", tmp_path / "x.pt")
    assert code == 2 and "No such checkpoint" in err
    (tmp_path / "empty").mkdir()
    code, _, err = _replay(capsys, tmp_path / "empty", "--model", MODEL, "--data", tmp_path / "x.pt")
    assert code == 2 and "Nothing to replay" in err and "found nothing (empty folders)" in err


def test_help_says_what_runs_code_and_the_exit_codes(capsys):
    assert main(["replay", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--model, --factory and --datamodule IMPORT AND RUN the code they name" in out
    assert "the working directory is not searched" in out
    assert (
        "--trust-checkpoints load checkpoints with torch.load(weights_only=False): RUNS CODE STORED IN THE FILES" in out
    )
    assert "3 non-finite values (NaN/inf weights or DyT inputs) in a replayed checkpoint" in out


def test_help_imports_neither_torch_nor_lightning():
    import subprocess
    import sys

    script = (
        "import sys\nfrom satmon.cli.main import main\nassert main(['replay', '--help']) == 0\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning', "
        "'pytorch_lightning', 'transformers'}))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "exit codes: 0 all replayed" in done.stdout and "130 interrupted (Ctrl-C)" in done.stdout


def test_partial_records_are_written_as_they_come_and_removed_when_complete(run, tmp_path, capsys, monkeypatch):
    """Each record reaches the partial file before the next checkpoint is read; the target only at the end."""
    from satmon.replaying import loop

    root, ckpts, _ = run
    seen = []
    real = loop._replay_one

    def spy(*a, **k):
        partial = tmp_path / "r.jsonl.partial.jsonl"
        seen.append(
            (len(partial.read_text().splitlines()) if partial.exists() else None, (tmp_path / "r.jsonl").exists())
        )
        return real(*a, **k)

    monkeypatch.setattr(loop, "_replay_one", spy)
    code, out, err = _replay(
        capsys,
        ckpts,
        "--model",
        MODEL,
        "--data",
        root / "calib.pt",
        "--level",
        LEVEL,
        "--logdir",
        tmp_path / "tb",
        "--json",
        tmp_path / "r.jsonl",
    )
    assert code == 0, err
    assert seen == [(0, False), (1, False), (2, False)]
    assert not (tmp_path / "r.jsonl.partial.jsonl").exists()
    assert [json.loads(line)["global_step"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == [3, 6, 9]
    assert "replaced the previous file" not in out  # a new file: nothing replaced, nothing said


def test_a_factory_replay_never_imports_lightning(run, tmp_path):
    """The whole command, plain weights with a factory, in a fresh process: no Lightning module is loaded."""
    import subprocess
    import sys

    root, ckpts, _ = run
    ckpt = torch.load(ckpts / "epoch=0-step=9.ckpt", weights_only=True)
    torch.save(
        {"model": {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}, "iter_num": 9},
        tmp_path / "weights.pt",
    )
    (tmp_path / "mymodels.py").write_text(FACTORY_SRC)
    script = (
        "import sys\nfrom satmon.cli.main import main\n"
        f"code = main(['replay', 'weights.pt', '--factory', 'mymodels.py:build', '--data', {str(root / 'calib.pt')!r}, "
        "'--logdir', 'tb', '--json', 'r.json', '--quiet'])\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "0 []"
