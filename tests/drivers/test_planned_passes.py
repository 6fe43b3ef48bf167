"""The planned passes over the unique data, counted from the trainer (steps x global batch x sequence length), and
the forecast they give on the card and in every logger: against hand-counted tokens."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import satmon
from helpers import RecordingSink, tiny_lit, token_loader, trainer
from satmon import SaturationMonitor
from satmon.drivers.counting import planned_tokens, sample_tokens
from satmon.drivers.lightning import _planned
from satmon.io.tags import TAG

pytestmark = pytest.mark.filterwarnings("ignore:.*validation_step.*", "ignore:.*window steps.*", "ignore:.*no logger.*")


class _Stream(IterableDataset):
    def __iter__(self):
        while True:
            yield torch.zeros(16, dtype=torch.long)


def test_planned_tokens_count_steps_batch_accumulation_ranks_and_sample_length():
    loader = token_loader(n_batches=8, batch_size=4, seq_len=16)  # samples are (x, y): 16 tokens of input each
    assert sample_tokens(loader)[0] == 16
    tokens, how = planned_tokens(100, 4, loader, accumulation=3, world_size=2)
    assert tokens == 100 * 4 * 3 * 2 * 16 and "3 accumulated x 2 ranks x 16 tokens" in how
    # a trainer-like object: what Lightning's trainer exposes (estimated optimizer steps already divide by accumulation)
    like = SimpleNamespace(
        estimated_stepping_batches=50, train_dataloader=loader, accumulate_grad_batches=2, world_size=4
    )
    assert _planned(like)[0] == 50 * 4 * 2 * 4 * 16
    like.train_dataloader = [loader]
    assert _planned(like)[0] == 50 * 4 * 2 * 4 * 16
    assert planned_tokens(float("inf"), 4, loader)[0] is None and "max_steps" in planned_tokens(None, 4, loader)[1]
    assert planned_tokens(10, None, loader)[0] is None
    assert sample_tokens(DataLoader(_Stream(), batch_size=2)) == (16, "a sample of _Stream holds 16 tokens")


def test_a_lightning_run_with_accumulation_counts_its_passes_and_logs_the_forecast(tmp_path):
    """max_steps 4 optimizer steps x batch 4 x accumulate 2 x 16 tokens = 512 planned tokens over 8 x 4 x 16 = 512
    unique ones: 1 pass, fewer than any known cell, so "uncertain"; with planned_tokens= given it reads that."""
    sink = RecordingSink()
    monitor = SaturationMonitor(window=4, sink=sink, unique_tokens=1_000_000, planned_tokens=2_500_000)
    plain = SaturationMonitor(window=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(tmp_path, max_steps=4, accumulate_grad_batches=2, callbacks=[plain]).fit(
            tiny_lit(), token_loader(8, 4, 16)
        )
        trainer(tmp_path, max_steps=4, callbacks=[monitor]).fit(tiny_lit(d_model=48), token_loader(8, 4, 16))
    f = plain.screen.forecast
    assert f.planned_tokens == 4 * 4 * 2 * 16 and f.unique_tokens == 8 * 4 * 16 and f.passes == 1.0
    # 1 pass: the third grid's 2 configurations there (GPT below one pass) agree, too few for a confident answer
    assert f.outcome == "uncertain" and "2 of the 2 configurations at 1 pass" in f.evidence
    assert "too few configurations" in f.evidence
    assert "Forecast from the planned passes (1 pass over the unique data" in plain.card()
    # given counts win: 2.5 passes at ~67k parameters and 15 tokens per parameter: outside the hull of the cells
    v = monitor.verdict
    params = sum(p.numel() for p in monitor.screen._model.parameters())
    # the run's steps and optimizer read from the trainer, its family (no gated MLP) and DyT's
    # alpha at attach from the model
    expected = satmon.forecast(
        params=params,
        unique_tokens=1_000_000,
        planned_tokens=2_500_000,
        steps=4,
        family="gpt",
        alpha_init=2.0,
        optimizer="adamw",
        final_norm="dyt",  # the demo GPT's ln_f, read from the forward
    )
    assert v.planned_forecast == expected.to_dict() and expected.outcome == "uncertain"
    assert (
        "**uncertain**: 2.5 passes lies between the measured 1.4 and" in v.card()
        and "too few configurations" in v.card()
    )
    assert v.decision in ("go", "no-go")  # the 0.43 decision stays beside it
    assert "; forecast from the planned passes: uncertain (2.5 passes)" in v.summary()
    assert "; forecast from the planned passes: uncertain (1 pass)" in plain.verdict.summary()
    scalars = {k: val for c in sink.calls if c[0] == "scalars" for k, val in c[1].items()}
    assert scalars[TAG.forecast] == 0.0
    assert any(
        c[1].get(TAG.hp_forecast) == "uncertain" and c[2].get(TAG.forecast) == 0.0
        for c in sink.calls
        if c[0] == "hparams"
    )
    assert any(
        "Forecast from the planned passes" in c[2] for c in sink.calls if c[0] == "text" and c[1] == TAG.verdict_text
    )


def test_a_screen_without_token_counts_says_which_are_missing_and_how_to_give_them():
    model = tiny_lit().model
    screen = satmon.Screen(window=2)
    screen.attach(model)
    x = torch.randint(0, 256, (2, 16))
    for _ in range(2):
        screen.step(model(x).float().mean())
    line = next(l for l in screen.card().splitlines() if l.startswith("Forecast from the planned passes"))
    assert "uncertain" in line and "a Screen does not see" in line and "planned_tokens=" in line
    assert screen.verdict.planned_forecast["outcome"] == "uncertain"


def test_a_screen_passes_the_runs_steps_warmup_and_schedule_to_the_forecast():
    """The forecast's domain reads the run's optimizer steps, warm-up and LR shape: given to the Screen as settings,
    they reach satmon.forecast; left out, the card says which is unknown and the option that gives it."""
    from satmon.dyt import DyT

    model = torch.nn.Sequential(DyT(339, alpha_init=2.0), torch.nn.Linear(339, 339))  # 115,600 parameters: d64L2's size
    params = sum(p.numel() for p in model.parameters())
    run = dict(unique_tokens=3_657_143, planned_tokens=5_120_000)  # 1.4 passes at 31.6 unique tokens per parameter
    schedule = dict(planned_steps=5000, warmup_steps=2000, lr_schedule="linear-warmup-constant")
    lines = {}
    for name, extra in (("described", schedule), ("not", {})):
        screen = satmon.Screen(window=2, **run, **extra)
        screen.attach(model)
        for _ in range(2):
            screen.step(model(torch.randn(4, 339)).float().mean())
        lines[name] = screen.verdict.planned_forecast
    # the family by what the model computes (no gated MLP: "gpt"), DyT's alpha at attach and the final norm (the DyT,
    # the last normaliser to run), read by the screen
    expected = satmon.forecast(
        params=params,
        unique_tokens=3_657_143,
        planned_tokens=5_120_000,
        steps=5000,
        warmup_steps=2000,
        lr_schedule="linear-warmup-constant",
        family="gpt",
        alpha_init=2.0,
        final_norm="dyt",
    )
    assert expected.outcome == "hurts" and lines["described"] == expected.to_dict()
    assert lines["not"]["outcome"] == "uncertain"
    assert "planned_steps=" in lines["not"]["evidence"] and "lr_schedule=" in lines["not"]["evidence"]
    with pytest.raises(ValueError, match="Expected `lr_schedule` as the learning rate's shape"):
        satmon.Screen(lr_schedule="")
    with pytest.raises(ValueError, match="warmup_steps"):
        satmon.Screen(warmup_steps=-1)


def test_the_family_is_read_from_what_the_model_computes_and_a_llama_run_is_never_confident_on_gpt_cells():
    """The same scale and schedule at 1.4 passes: a GPT block (plain MLP) reads "gpt" and gets the cells' answer; a
    LLaMA block (DyT feeding a SwiGLU gate) reads "llama" and, with no LLaMA cell shipped, "uncertain"."""
    run = dict(
        unique_tokens=3_657_143,
        planned_tokens=5_120_000,
        planned_steps=5000,
        warmup_steps=2000,
        lr_schedule="linear-warmup-constant",
    )
    got = {}
    for arch in ("gpt", "llama"):
        model = tiny_lit(arch=arch).model
        screen = satmon.Screen(window=2, **run)
        x = torch.randint(0, 256, (2, 16))
        screen.attach(model, example_input=x)
        for _ in range(2):
            screen.step(model(x).float().mean())
        got[arch] = screen.verdict.planned_forecast
    assert (got["gpt"]["family"], got["llama"]["family"]) == ("gpt", "llama")
    # the llama family's cells (the third grid's, one configuration a budget) bear on the llama run only
    assert got["llama"]["outcome"] == "uncertain" and "(satmon-llama)" in " ".join(got["llama"]["rests_on"])
    assert "too few configurations" in got["llama"]["evidence"]
    assert got["gpt"]["alpha_init"] == 2.0 and "llama" not in got["gpt"]["evidence"]


@pytest.mark.parametrize("trap_every_n_steps", [10, 0])
def test_the_final_norm_is_read_from_the_forward_and_a_layernorm_head_is_not_confident_on_dyt_cells(
    trap_every_n_steps,
):
    """The demo GPT at d64L2's size, 1.4 passes, the grids' schedule: with DyT before the head (as the builtin grid's
    DyT arm) the screen reads "dyt" and gets the cells' answer; the same blocks with LayerNorm before the head read
    "norm" and "uncertain", naming final_norm. The kind comes from the first forward's module order (detached once
    read), with the trap watch on or off."""
    from satmon.demos.gpt import GPT, GPTConfig

    run = dict(unique_tokens=3_657_143, planned_tokens=5_120_000)
    schedule = dict(steps=5000, warmup_steps=2000, lr_schedule="linear-warmup-constant")
    got, screens = {}, {}
    for head in ("dyt", "layernorm"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(seq_len=16))  # DyT in every block and before the head
        if head == "layernorm":
            model.ln_f = torch.nn.LayerNorm(64)  # named as before: only the forward says what it is
        screen = satmon.Screen(
            window=2,
            trap_every_n_steps=trap_every_n_steps,
            planned_steps=schedule["steps"],
            **run,
            **{k: v for k, v in schedule.items() if k != "steps"},
        )
        x = torch.randint(0, 256, (2, 16))
        screen.attach(model, example_input=x)
        for _ in range(2):
            screen.step(model(x).float().mean())
        got[head], screens[head] = screen.verdict.planned_forecast, screen
        params = sum(p.numel() for p in model.parameters())
        expected = satmon.forecast(
            params=params, **run, **schedule, family="gpt", alpha_init=2.0, final_norm=head
        ).to_dict()
        assert got[head] == expected, head
    assert (got["dyt"]["final_norm"], got["layernorm"]["final_norm"]) == ("dyt", "norm")
    assert got["dyt"]["outcome"] == "hurts"
    assert (
        got["layernorm"]["outcome"] == "uncertain" and "final_norm='norm'), theirs DyT" in got["layernorm"]["evidence"]
    )
    assert all(s._final.order is None for s in screens.values())  # its order: off once the first forward was read


def test_where_no_forward_records_the_final_norm_the_setting_stands_in_and_else_it_is_unknown(monkeypatch):
    """A compiled forward records no module order (as ``torch.compiler.is_compiling()`` says inside a graph): the
    final norm stays unknown, and the forecast on the grids' DyT cells says so, naming ``Settings(final_norm=)``;
    given as a setting, it stands in, and the answer is the cells'."""
    from satmon.demos.gpt import GPT, GPTConfig

    run = dict(unique_tokens=3_657_143, planned_tokens=5_120_000)
    schedule = dict(warmup_steps=2000, lr_schedule="linear-warmup-constant")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # every hook sees a graph being traced
    got = {}
    for given in (None, "dyt"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(seq_len=16))
        screen = satmon.Screen(window=2, trap_every_n_steps=0, planned_steps=5000, final_norm=given, **run, **schedule)
        x = torch.randint(0, 256, (2, 16))
        screen.attach(model, example_input=x)
        for _ in range(2):
            screen.step(model(x).float().mean())
        got[given] = screen.verdict.planned_forecast
    assert got[None]["final_norm"] is None and got[None]["outcome"] == "uncertain"
    assert "Settings(final_norm=)" in got[None]["evidence"]
    assert (got["dyt"]["final_norm"], got["dyt"]["outcome"]) == ("dyt", "hurts")
    with pytest.raises(ValueError, match="Expected final_norm as 'dyt'.*got 'batchnorm'"):
        satmon.Settings(final_norm="batchnorm")
