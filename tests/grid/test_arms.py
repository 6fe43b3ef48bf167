"""N arms, ``--vary`` axes, the llama recipe and the recorded collapse watch, on tiny cells trained for real."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from satmon.grid.builtin_llama import RECIPE as LLAMA
from satmon.grid.cell import cell_key, grid_key, make_spec, measure_cell
from satmon.grid.config import Budget, GridSettings
from satmon.grid.vary import parse_vary, vary_configs

SMOKE = LLAMA.presets["smoke"]


def _settings(**kw) -> GridSettings:
    return GridSettings(
        **{**SMOKE["settings"], "steps": 110, "window": 20, "warmup": 10, "eval_every": 50, "series_every": 10, **kw}
    )


def _spec(settings: GridSettings, **opts):
    return make_spec(
        LLAMA, settings, LLAMA.options_with({**SMOKE["options"], **opts}), "d16L1", Budget.parse("2000"), 0
    )


@pytest.fixture(scope="module")
def flagged_cell():
    """alpha_init=50 saturates every DyT layer from the first step: the watch must flag, and training go on."""
    st = _settings()
    return st, measure_cell(LLAMA, st, _spec(st, alpha_init="50"), arms=("rmsnorm", "dyt", "dyt-gelu"))


def test_every_arm_recorded_and_trained_to_the_end(flagged_cell):
    st, cell = flagged_cell
    assert cell["reference_arm"] == "rmsnorm" and cell["compared_arm"] == "dyt"
    assert list(cell["arms"]) == ["rmsnorm", "dyt", "dyt-gelu"]
    for arm, r in cell["arms"].items():
        assert r["val_curve"][-1][0] == st.steps  # no arm stopped at a flag
        assert r["best_val_loss"] == min(v for _, v in r["val_curve"])
        assert ("watch" in r) == arm.startswith("dyt")
    assert cell["val_loss_layernorm"] == cell["arms"]["rmsnorm"]["val_loss"]  # the two-arm fields: reference, compared
    assert cell["val_loss_dyt"] == cell["arms"]["dyt"]["val_loss"]
    json.dumps(cell, allow_nan=False)


def test_watch_checks_every_50_steps_after_the_window_and_flags(flagged_cell):
    st, cell = flagged_cell
    w = cell["arms"]["dyt"]["watch"]
    assert (w["every_n_steps"], w["collapse_threshold"], w["patience"]) == (50, 0.5, 1)  # the shipped defaults
    steps = [c["step"] for c in w["checks"]]
    assert len(steps) == 2 and all(s > st.window for s in steps) and steps[1] - steps[0] == 50
    assert all(c["gated_saturation"] > 0.5 and c["flagged"] for c in w["checks"])  # alpha 50: |50 x| >= 2 nearly always
    assert w["first_flag_step"] == steps[0]
    # the window pools every DyT layer (0.21 here: the inputs start small), the watch only those feeding gated MLPs
    assert w["window_collapse_risk"] is (cell["arms"]["dyt"]["window_saturation"] >= 0.5) is False
    assert w["would_stop_at"] == steps[0]
    gelu = cell["arms"]["dyt-gelu"]["watch"]["checks"]
    # no gated MLP: nothing to flag
    assert gelu and all(c["gated_saturation"] is None and not c["flagged"] for c in gelu)


def test_arms_start_from_the_reference_weights_where_they_share_a_tensor():
    st = _settings()
    spec = _spec(st)
    ref = LLAMA.model(spec, "rmsnorm").state_dict()
    gelu = LLAMA.model(spec, "dyt-gelu").state_dict()
    shared = [k for k in gelu if k in ref and ref[k].shape == gelu[k].shape]
    assert "blocks.0.attn.q_proj.weight" in shared and "lm_head.weight" in shared
    assert all(torch.equal(ref[k], gelu[k]) for k in shared)
    torch.manual_seed(0)  # the GELU MLP: LlamaLM's own init under the cell's seed
    from satmon.demos.llama import LlamaLM

    own = LlamaLM(vocab_size=256, d_model=16, n_layers=1, n_heads=2, seq_len=16, norm="dyt", mlp="gelu").state_dict()
    assert torch.equal(own["blocks.0.mlp.fc_in.weight"], gelu["blocks.0.mlp.fc_in.weight"])


def test_vary_typed_keyed_and_refused_before_work():
    st = _settings()
    opts = LLAMA.options_with(SMOKE["options"])
    configs = vary_configs(LLAMA, st, opts, parse_vary(["alpha_init=0.5,2", "lr=1e-3,3e-3", "warmup=5"]))
    assert [(v["alpha_init"], v["lr"], v["warmup"]) for v, _, _ in configs] == [
        ("0.5", 1e-3, 5),
        ("0.5", 3e-3, 5),
        ("2", 1e-3, 5),
        ("2", 3e-3, 5),
    ]
    assert all(s.lr == v["lr"] and s.warmup == 5 and o["alpha_init"] == v["alpha_init"] for v, s, o in configs)
    keys = {grid_key({"name": "x"}, s, o) for _, s, o in configs}
    assert len(keys) == 4
    with pytest.raises(ValueError, match=r"--vary KEY among .*alpha_init.*got 'alpha'"):
        vary_configs(LLAMA, st, opts, parse_vary(["alpha=1"]))
    with pytest.raises(ValueError, match="steps"):
        vary_configs(LLAMA, st, opts, parse_vary(["steps=10,20"]))
    with pytest.raises(ValueError, match=r"--vary warmup= an int"):
        vary_configs(LLAMA, st, opts, parse_vary(["warmup=1.5"]))


def test_default_arms_and_late_options_keep_the_old_keys():
    """A default two-arm builtin cell keeps the key it had before arms, --vary and corpus= existed."""
    from satmon.grid.builtin import RECIPE as GPT
    from satmon.grid.config import options_json

    opts = GPT.options_with({})
    assert "corpus" in opts and "corpus" not in GPT.keyed_options(opts)
    old = hashlib.sha256(
        json.dumps(
            {
                "recipe": {"name": "r"},
                "settings": GridSettings().shared(),
                "options": options_json({k: v for k, v in opts.items() if k != "corpus"}),
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
    ).hexdigest()
    assert grid_key({"name": "r"}, GridSettings(), options_json(GPT.keyed_options(opts)), ("layernorm", "dyt")) == old
    assert (
        grid_key({"name": "r"}, GridSettings(), options_json(GPT.keyed_options(opts)), ("layernorm", "dyt", "x")) != old
    )
    torch_opts = GPT.options_with({"corpus": "torch"})
    assert GPT.keyed_options(torch_opts)["corpus"] == "torch"
    assert cell_key(old, "d64L2", 1, 0) == cell_key(old, "d64L2", 1, 0)


def test_pick_arms_refuses_naming_the_choices():
    assert LLAMA.pick_arms("dyt,rmsnorm") == ("rmsnorm", "dyt")
    with pytest.raises(ValueError, match="rmsnorm, dyt, dyt-gelu, rmsnorm-gelu.*got bogus"):
        LLAMA.pick_arms("rmsnorm,bogus")
    with pytest.raises(ValueError, match="reference arm 'rmsnorm'"):
        LLAMA.pick_arms("dyt")


def test_cli_refuses_an_unknown_vary_key_and_arm_before_work(tmp_path):
    from grid_helpers import satmon_cli

    proc = satmon_cli("grid", "llama", "--smoke", "--out", "g", "--vary", "bogus=1,2", cwd=tmp_path)
    assert proc.returncode == 2 and "Expected --vary KEY among" in proc.stderr and "alpha_init" in proc.stderr
    proc = satmon_cli("grid", "llama", "--smoke", "--out", "g", "--arms", "rmsnorm,nope", cwd=tmp_path)
    assert proc.returncode == 2 and "got nope" in proc.stderr
    assert not (tmp_path / "g").exists()


def test_torch_corpus_is_the_sorted_torch_sources():
    from pathlib import Path

    from satmon.demos.corpus import torch_source_identity, torch_source_tokens

    root = Path(torch.__path__[0])
    files = sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
    ident = torch_source_identity()
    assert ident["corpus_bytes"] == sum(p.stat().st_size for p in files) == torch_source_tokens().numel()
    assert ident["corpus_files"] == len(files) and ident["torch"] == torch.__version__
    first = files[0].read_bytes()
    assert bytes(torch_source_tokens()[: len(first)].to(torch.uint8).tolist()) == first
    from satmon.grid.builtin import RECIPE as GPT

    st = GridSettings()
    spec = make_spec(
        GPT, st, GPT.options_with({"corpus": "torch", "data": "chunks"}), "d64L2", Budget.parse("0.25ep"), 4
    )
    GPT.check(spec)  # 20.5 MB of unique bytes fit the torch corpus
    assert GPT.describe(spec)["corpus_sha256"] == ident["corpus_sha256"]
    with pytest.raises(ValueError, match="stdlib or corpus=torch"):
        GPT.check(make_spec(GPT, st, GPT.options_with({"corpus": "web"}), "d64L2", Budget.parse("16ep"), 4))


def test_default_warmup_scales_and_the_size_is_reported_first(tmp_path):
    from grid_helpers import satmon_cli

    from satmon.grid.config import default_warmup

    assert [GridSettings(steps=n).warmup for n in (5_000, 600, 8)] == [2_000, 240, 3]
    assert GridSettings(steps=600, warmup=0).warmup == 0
    GridSettings(steps=600, window=60).check()  # issue 44.2's documented command: valid now
    assert default_warmup(5_000) == 2_000
    proc = satmon_cli(
        "grid",
        "builtin",
        "--sizes",
        "bogus",
        "--budgets",
        "16ep",
        "--seeds",
        "0",
        "--steps",
        "8",
        "--out",
        "g",
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "'bogus'" in proc.stderr and "warmup" not in proc.stderr


def test_a_reading_that_cannot_be_computed_is_null_with_why():
    from satmon.grid.cell import missing_as_null

    rec = missing_as_null({"window_loss_trend": {"slope": float("nan"), "n": 2}, "curve": [(1, float("inf"))]})
    assert rec["window_loss_trend"] == {"slope": None, "n": 2} and rec["curve"] == [[1, None]]
    assert set(rec["missing"]) == {"window_loss_trend.slope", "curve[0][1]"}
    json.dumps(rec, allow_nan=False)
