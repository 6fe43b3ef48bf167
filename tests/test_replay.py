"""``satmon replay``: a real training run's checkpoints, replayed and checked against an independent
float64 count, the live probe, TensorBoard, JSON and the markdown report; broken files; bad usage."""

from __future__ import annotations

import fractions
import json
import shutil
import warnings

import lightning.pytorch as pl
import pytest
import torch
from helpers import tiny_lit
from lightning.pytorch.callbacks import ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from satmon import SaturationMonitor, find_dyt_layers
from satmon.cli.main import main
from satmon.demos.corpus import CorpusDataModule
from satmon.probing import feed_first
from satmon.replay import CheckpointInfo, input_forward_fn, order_checkpoints

LEVEL = 0.5  # at the tiny model's scale |alpha x| > 2 is never reached; 0.5 spreads layers over 0 .. 0.9
MODEL = "satmon.demos.lit:LitLM"
DM_ARGS = dict(seq_len=16, batch_size=4, train_tokens=20_000, val_tokens=2_000, seed=0)


def _calibration() -> list[tuple[torch.Tensor, torch.Tensor]]:
    dm = CorpusDataModule(**DM_ARGS)
    dm.setup("fit")
    return [b for _, b in zip(range(3), dm.train_dataloader())]


def _train(root, norm="dyt", steps=9, every=3, callbacks=()):
    pl.seed_everything(0, verbose=False)
    ckpt = ModelCheckpoint(dirpath=root / "ckpts", every_n_train_steps=every, save_top_k=-1)
    trainer = pl.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=[ckpt, *callbacks],
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
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
    code, out, err = _replay(capsys, ckpts, "--model", MODEL, "--data", root / "calib.pt", "--level", LEVEL,
                             "--logdir", tmp_path / "tb", "--json", tmp_path / "r.json")
    assert code == 0, err
    records = json.loads((tmp_path / "r.json").read_text())
    assert [r["global_step"] for r in records] == [3, 6, 9]  # by the step inside the file, not the name
    assert records[0]["checkpoint"].endswith("zz-first.ckpt")
    batches = torch.load(root / "calib.pt")
    for rec in records:
        ref = _reference(rec["checkpoint"], batches)
        pooled = sum(s for s, _ in ref.values()) / sum(t for _, t in ref.values())
        assert rec["verdict"]["saturation"] == pytest.approx(pooled, abs=1e-12)
        assert rec["verdict"]["step"] == rec["global_step"]
        for name, (s, t) in ref.items():
            assert rec["layers"][name]["saturation"] == pytest.approx(s / t, abs=1e-12)
    assert 0.05 < records[-1]["verdict"]["saturation"] < 0.95  # a reading with something to compare

    acc = EventAccumulator(str(tmp_path / "tb" / "replay" / "version_0"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    sat = acc.Scalars("satmon/saturation")
    assert [e.step for e in sat] == [3, 6, 9]
    assert [e.value for e in sat] == pytest.approx([r["verdict"]["saturation"] for r in records], abs=1e-6)
    layer = "model.ln_f"
    assert [e.step for e in acc.Scalars(f"satmon/saturation/{layer}")] == [3, 6, 9]
    assert [e.step for e in acc.Scalars("satmon/sigma_min/min_ratio")] == [3, 6, 9]
    assert [e.step for e in acc.Tensors("satmon/verdict/text_summary")] == [3, 6, 9]
    assert "| step" in out and "zz-first.ckpt" in out  # the console summary


def test_live_probe_and_replay_agree(run, tmp_path, capsys):
    root, ckpts, live = run
    code, _, err = _replay(capsys, ckpts / "epoch=0-step=6.ckpt", "--model", MODEL, "--data", root / "calib.pt",
                           "--level", LEVEL, "--logdir", tmp_path, "--json", tmp_path / "r.json")
    assert code == 0, err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    want = live[6].to_dict()  # SaturationMonitor(probe_on_checkpoint=True): the probe at the step-6 save
    assert rec["global_step"] == 6
    assert rec["saturation"] == want["saturation"]  # exact integer counts on the same weights and batches
    assert {n: v["saturation"] for n, v in rec["layers"].items()} == {n: v["saturation"] for n, v in want["layers"].items()}
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
    code, out, err = _replay(capsys, folder, "--model", MODEL, "--datamodule", "satmon.demos.corpus:CorpusDataModule",
                             "--batches", 2, "--logdir", tmp_path / "tb", "--json", tmp_path / "r.json")
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
    code, _, err = _replay(capsys, tmp_path / "bad-shape.ckpt", tmp_path / "good.ckpt", "--model", MODEL,
                           "--data", run[0] / "calib.pt", "--logdir", tmp_path / "tb", "--json", tmp_path / "r.json")
    assert code == 1 and "bad-shape.ckpt" in err and "size mismatch" in err
    records = json.loads((tmp_path / "r.json").read_text())
    assert [("error" in r, r["global_step"]) for r in records] == [(True, 6), (False, 9)]


def test_json_and_markdown_report_with_plots(tmp_path, capsys):
    # a LayerNorm model: alignment, null space and the init-gap twin, beside the DyT run's saturation plot
    ckpts = _train(tmp_path, norm="layernorm", steps=4, every=2)
    torch.save(_calibration(), tmp_path / "calib.pt")
    code, out, err = _replay(capsys, ckpts, "--model", MODEL, "--data", tmp_path / "calib.pt", "--logdir", tmp_path / "tb",
                             "--json", tmp_path / "out" / "r.jsonl", "--report", tmp_path / "out" / "report.md")
    assert code == 0, err
    lines = (tmp_path / "out" / "r.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["global_step"] for r in records] == [2, 4]
    for r in records:
        assert {"checkpoint", "global_step", "verdict", "layers", "sigma_min", "norm_type", "init_gap"} <= set(r)
        assert r["verdict"] is None and r["norm_type"] == "layernorm-like"
        assert all(v["kind"] == "layernorm" and v["alignment"] > 0.999 and v["null_dim"] == 1 for v in r["layers"].values())
        assert set(r["init_gap"]) == set(r["layers"])
        assert r["sigma_min"]["blocks"][0] == "embedding" and len(r["sigma_min"]["ratios"]) == 3
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# satmon replay report") and "| step" in md and "layernorm-like" in md
    for png in ("report_sigma_min.png", "report_alignment.png"):
        assert f"]({png})" in md
        data = (tmp_path / "out" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024
    assert "no DyT layer" in md  # the saturation plot is left out, and the report says why


def test_dyt_report_has_saturation_plot_and_verdict_card(run, tmp_path, capsys):
    root, ckpts, _ = run
    code, _, err = _replay(capsys, ckpts, "--model", MODEL, "--data", root / "calib.pt", "--level", LEVEL,
                           "--logdir", tmp_path, "--report", tmp_path / "r.md", "--quiet")
    assert code == 0, err
    md = (tmp_path / "r.md").read_text()
    data = (tmp_path / "r_saturation.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024
    assert "](r_saturation.png)" in md and "](r_sigma_min.png)" in md and "### satmon verdict" in md


def test_weights_only_fallback_is_reported_and_can_be_refused(run, tmp_path, capsys):
    root, ckpts, _ = run
    ckpt = torch.load(ckpts / "epoch=0-step=6.ckpt", weights_only=True)
    ckpt["user_extra"] = fractions.Fraction(1, 3)  # not on torch's weights_only allow-list
    torch.save(ckpt, tmp_path / "pickled.ckpt")
    args = [tmp_path / "pickled.ckpt", "--model", MODEL, "--data", root / "calib.pt", "--logdir", tmp_path / "tb",
            "--json", tmp_path / "r.json"]
    code, _, err = _replay(capsys, *args)
    assert code == 0, err
    assert "weights_only=False" in err and "pickled.ckpt" in err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    assert rec["weights_only"] is False and any("weights_only=False" in n for n in rec["notes"])
    code, _, err = _replay(capsys, *args, "--weights-only")
    assert code == 1 and "pickled.ckpt" in err and "weights_only=True) refused" in err


def test_plain_state_dict_with_factory(run, tmp_path, capsys, monkeypatch):
    root, ckpts, _ = run
    ckpt = torch.load(ckpts / "epoch=0-step=9.ckpt", weights_only=True)
    sd = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}
    torch.save({"model": sd, "iter_num": 9}, tmp_path / "weights.pt")
    (tmp_path / "mymodels.py").write_text(
        "from satmon.demos.gpt import GPT, GPTConfig\n"
        "def build():\n    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16))\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = _replay(capsys, "weights.pt", "--factory", "mymodels:build", "--data", root / "calib.pt",
                           "--level", LEVEL, "--logdir", "tb", "--json", "r.json")
    assert code == 0, err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    want = _reference(ckpts / "epoch=0-step=9.ckpt", torch.load(root / "calib.pt"))
    assert rec["global_step"] == 9
    assert rec["layers"]["ln_f"]["saturation"] == pytest.approx(want["model.ln_f"][0] / want["model.ln_f"][1], abs=1e-12)


def test_safetensors_with_factory_and_data_file_beside_it(run, tmp_path, capsys, monkeypatch):
    safetensors = pytest.importorskip("safetensors.torch")
    root, ckpts, _ = run
    ckpt = torch.load(ckpts / "epoch=0-step=6.ckpt", weights_only=True)
    safetensors.save_file({k.removeprefix("model."): v.contiguous() for k, v in ckpt["state_dict"].items()
                           if k != "model.lm_head.weight"}, str(tmp_path / "w.safetensors"))
    shutil.copy(root / "calib.pt", tmp_path / "calib.pt")  # in the replayed folder: must not be taken for a checkpoint
    (tmp_path / "mymodels2.py").write_text(
        "from satmon.demos.gpt import GPT, GPTConfig\n"
        "def build():\n    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16))\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = _replay(capsys, ".", "--factory", "mymodels2:build", "--data", "calib.pt", "--logdir", "tb", "--json", "r.json")
    assert code == 0, err
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    assert rec["checkpoint"].endswith("w.safetensors") and rec["global_step"] == 0  # no step in the file: its position
    assert any("no global step" in n for n in rec["notes"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "satmon.demos.lit"], "MODULE:NAME"),
        (["--model", "no_such_module_xyz:Net"], "cannot import module 'no_such_module_xyz'"),
        (["--model", "satmon.demos.lit:NoSuchClass"], "has no attribute 'NoSuchClass'"),
        (["--model", "satmon.demos.lit:build_model"], "expected a LightningModule class"),
        (["--model", MODEL, "--data", "missing.pt"], "--data 'missing.pt': no such file"),
        (["--model", MODEL, "--no-data"], "No calibration data: pass --data FILE"),
        (["--model", MODEL, "--datamodule", "satmon.demos.corpus:Nope"], "has no attribute 'Nope'"),
    ],
)
def test_usage_errors_exit_2_with_one_clear_message(run, tmp_path, capsys, args, message):
    root, ckpts, _ = run
    if "--no-data" in args:
        args = [a for a in args if a != "--no-data"]
    elif "--data" not in args and "--datamodule" not in args:
        args = args + ["--data", str(root / "calib.pt")]
    code, _, err = _replay(capsys, ckpts, *args, "--logdir", tmp_path)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_path_and_empty_dir_exit_2(tmp_path, capsys):
    code, _, err = _replay(capsys, tmp_path / "nope", "--model", MODEL, "--data", "x.pt")
    assert code == 2 and "No such checkpoint" in err
    code, _, err = _replay(capsys, tmp_path, "--model", MODEL, "--data", "x.pt")
    assert code == 2 and "No checkpoint" in err


def test_input_rule():
    x = torch.zeros(2, 8, dtype=torch.long)
    assert input_forward_fn([(x, x)]) is feed_first  # (inputs, integer targets of the same shape)
    assert input_forward_fn([(x, torch.zeros(2, 8))]) is None  # a float second tensor is an input
    assert input_forward_fn([(x, x[:, :4])]) is None
    assert input_forward_fn([x]) is None
    fn = input_forward_fn([{"input_ids": x, "labels": x}], input_key="input_ids")
    assert fn(lambda t: t.shape, {"input_ids": x, "labels": x}) == (2, 8)


def test_order_by_step_and_last_ckpt_dropped(tmp_path):
    infos = [CheckpointInfo(tmp_path / n, "lightning", s) for n, s in
             [("last.ckpt", 20), ("b.ckpt", 20), ("a.ckpt", 10), ("nostep.pt", None), ("last-v1.ckpt", 30)]]
    infos.append(CheckpointInfo(tmp_path / "broken.ckpt", error="x"))
    assert [i.path.name for i in order_checkpoints(infos)] == ["a.ckpt", "b.ckpt", "last-v1.ckpt", "nostep.pt"]
