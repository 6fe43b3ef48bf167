"""satmon.probe under a memory budget: the same readings bit for bit, never more matrices held than planned."""

from __future__ import annotations

import logging
import weakref

import pytest
import torch
from torch import Tensor

import satmon.observe.covariance as covariance_taps
from satmon.demos.gpt import GPT, GPTConfig
from satmon.demos.llama import LlamaLM
from satmon.io.json_records import to_json
from satmon.probing.memory_plan import READOUT_MATRICES, matrix_bytes
from satmon.probing.passes import probe

D = 64
ONE_MATRIX = matrix_bytes(D) + READOUT_MATRICES * 8 * D * D  # the smallest budget: one matrix per pass


def _tokens(seed: int, n_batches: int = 2, batch: int = 8, seq: int = 64) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (batch, seq), generator=g) for _ in range(n_batches)]


def _readings(report) -> dict:
    d = to_json(report.to_dict())
    d.pop("elapsed_s")
    return d


@pytest.mark.parametrize(
    "make",
    [
        lambda: GPT(GPTConfig(norm="layernorm", n_layers=2, dropout=0.1)),
        lambda: LlamaLM(vocab_size=256, d_model=D, n_layers=2, n_heads=2, seq_len=64, alpha_init=20.0),
    ],
    ids=["layernorm-gpt-dropout", "gated-dyt-llama"],
)
def test_one_matrix_per_pass_gives_the_one_pass_readings_bit_for_bit(make):
    torch.manual_seed(0)
    model = make()
    x = _tokens(0)
    # train mode: dropout draws from the RNG, so every pass must start from the same RNG state
    whole = probe(model, x, train_mode=True)
    # a one-shot iterator: kept for the passes
    grouped = probe(model, iter(x), train_mode=True, memory_budget=ONE_MATRIX)
    assert whole.plan.passes == 1 and grouped.plan.passes == grouped.plan.matrices == whole.plan.matrices > 1
    assert _readings(grouped) == _readings(whole)  # floats compared exactly
    assert grouped.verdict == whole.verdict and grouped.batches == 2  # DyT counted once, not once per pass


def test_no_more_matrices_alive_than_the_plan_holds(monkeypatch):
    alive: set[int] = set()
    most = [0]

    class Counted(covariance_taps.CovarianceAccumulator):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            key = id(self)
            alive.add(key)
            most[0] = max(most[0], len(alive))
            weakref.finalize(self, alive.discard, key)

    monkeypatch.setattr(covariance_taps, "CovarianceAccumulator", Counted)
    torch.manual_seed(0)
    model = GPT(GPTConfig(norm="layernorm", n_layers=2))  # 5 LayerNorms + 3 streams, d = 64
    report = probe(model, _tokens(0), memory_budget=2 * matrix_bytes(D) + READOUT_MATRICES * 8 * D * D)
    assert (
        report.plan.matrices == 8 and report.plan.passes == 4 and [len(g) for g in report.plan.groups] == [2, 2, 2, 2]
    )
    assert most[0] == 2
    most[0] = 0
    probe(model, _tokens(0))
    assert most[0] == 8  # without a budget every matrix is alive at once


def test_a_budget_below_one_matrix_is_refused_before_any_forward():
    model = GPT(GPTConfig(norm="layernorm", n_layers=1))
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=r"hold at least one covariance matrix.*d=64.*Raise `memory_budget`"):
        probe(model, _tokens(0), memory_budget=ONE_MATRIX - 1)
    with pytest.raises(ValueError, match="Expected `memory_budget` as a positive number of bytes"):
        probe(model, _tokens(0), memory_budget="lots")
    assert calls == []


def test_the_plan_is_logged_and_printed_before_the_run(caplog, capsys):
    model = GPT(GPTConfig(norm="layernorm", n_layers=1))
    with caplog.at_level(logging.INFO, logger="satmon.probing.passes"):
        report = probe(model, _tokens(0), memory_budget="300KiB", verbose=True)
    line = report.plan.describe()  # a group of 3: 3 x 32.5 KiB + the readout's 6 x 32 KiB = 290 KiB <= 300 KiB
    assert line.startswith("satmon probe plan: 5 covariance matrices (d=64: 32.5 KiB each) in 2 pass(es) of <= 3")
    assert "peak 290 KiB (budget 300 KiB)" in line
    assert capsys.readouterr().out.strip() == line
    assert [r.getMessage() for r in caplog.records if r.name == "satmon.probing.passes"] == [line]
