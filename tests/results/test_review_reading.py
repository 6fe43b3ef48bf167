"""Review of the one reading and what the user reads: every surface says how far to trust a decision.

A replayed checkpoint whose verdict is qualified (flagged, uncalibrated, inconclusive) must not read as a
bare GO / NO-GO in the replay's per-checkpoint line, its table, its "Last checkpoint" summary line or the
markdown report's table: the trust goes with the decision, as in the card's headline.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from satmon import probe
from satmon.cli.replay import _summary
from satmon.replaying.loop import summary_row
from satmon.results.verdict import LayerCounts, Rule, build_verdict

_OFFSET = {"ln_f": {"saturated": 0.6, "centered": 0.01, "offset_ratio": 40.0}}


def _qualified():
    """Replay verdicts the study's rule calls GO / NO-GO but whose trust is not ok, and one that is."""
    return {
        "flagged": build_verdict(
            {"ln_f": LayerCounts(60, 100)}, step=9, source="replay", offset=_OFFSET, offset_flag=True
        ),
        "uncalibrated": build_verdict({"ln_f": LayerCounts(10, 100)}, step=9, source="replay", functions=("erf",)),
        "inconclusive": build_verdict({"ln_f": LayerCounts(44, 100)}, step=9, source="replay"),
    }


@pytest.mark.parametrize("trust", ["flagged", "uncalibrated", "inconclusive"])
def test_a_qualified_replay_verdict_carries_its_trust_in_the_table_and_summary_line(trust, capsys):
    v = _qualified()[trust]
    assert v.trust == trust and v.decision in ("go", "no-go")
    record = {"checkpoint": "ckpts/step=9.ckpt", "global_step": 9, "verdict": v.to_dict(), "nonfinite_weights": 0}
    row = summary_row(record)
    word = v.decision.upper()
    assert row["decision"] == f"{word} ({trust})"  # never a bare GO / NO-GO
    _summary([dict(row, seconds=0.1)], [SimpleNamespace(verdict=v, global_step=9)])
    out = capsys.readouterr().out
    last = next(line for line in out.splitlines() if line.startswith("Last checkpoint"))
    assert last.startswith(f"Last checkpoint (step 9): {v.headline()}")
    assert "a measurement, not a forecast" in last and "keep it" not in out


def test_a_trusted_replay_verdict_reads_as_a_bare_decision():
    fitted = Rule(0.43, threshold_source="calibration", held_out_accuracy=0.8, no_skill_accuracy=0.6, held_out_cells=50)
    v = build_verdict({"ln_f": LayerCounts(10, 100)}, fitted, step=9, source="replay")
    assert v.trust == "ok"
    row = summary_row({"checkpoint": "step=9.ckpt", "global_step": 9, "verdict": v.to_dict()})
    assert row["decision"] == "NO-GO"
    unproven = build_verdict({"ln_f": LayerCounts(10, 100)}, step=9, source="replay")  # the study's 0.43: at chance
    assert summary_row({"checkpoint": "step=9.ckpt", "global_step": 9, "verdict": unproven.to_dict()})["decision"] == (
        "NO-GO (unproven)"
    )


class _Derf(torch.nn.Module):
    """Derf without a shift: ``weight * erf(alpha * x) + bias`` (a hand-built layer, alpha 2)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.full((1,), 2.0))
        self.weight, self.bias = torch.nn.Parameter(torch.ones(d)), torch.nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return self.weight * torch.erf(self.alpha * x) + self.bias


def test_the_card_states_the_cut_off_an_erf_layer_was_counted_with():
    """A Derf layer is counted at |u| > 1.6279 (erf's gain at tanh's level 2, docs/science/science.md), not at 2: the
    card says the cut-off the counts used, checked against a float64 count of the same inputs."""
    torch.manual_seed(0)
    xs = [torch.randn(64, 8) for _ in range(3)]
    v = probe(torch.nn.Sequential(_Derf(8)), xs).verdict
    u = 2.0 * torch.cat(xs).double()
    cut = math.sqrt(-math.log(1 - math.tanh(2.0) ** 2))
    assert v.saturation == pytest.approx((u.abs() > cut).double().mean().item(), abs=1e-12)
    assert v.saturation != pytest.approx((u.abs() > 2).double().mean().item(), abs=1e-3)
    line = next(l for l in v.card().splitlines() if "saturated means" in l)
    assert "> 2;" not in line and f"{cut:.4g}" in line and "erf" in line
    dyt = build_verdict({"ln_f": LayerCounts(5, 10)}, step=1, window=1)  # a DyT card reads as before
    assert "saturated means |alpha x| > 2; 10 elements counted." in dyt.card()


def test_a_non_finite_alpha_is_not_called_a_non_finite_input():
    """A DyT whose alpha is inf on finite inputs: NON-FINITE, and the headline does not say the inputs were."""
    from satmon import DyT

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), DyT(8, alpha_init=2.0))
    with torch.no_grad():
        model[1].alpha.fill_(float("inf"))
    xs = [torch.randn(16, 8) for _ in range(2)]
    assert all(torch.isfinite(model[0](x)).all() for x in xs)  # what the DyT layer receives is finite
    v = probe(model, xs).verdict
    assert v.decision == "non-finite"
    assert "alpha" in v.headline() and "NaN/inf in the DyT inputs:" not in v.headline()
