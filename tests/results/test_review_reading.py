"""Review of the one reading and what the user reads: every surface says how far to trust a decision.

A replayed checkpoint whose verdict is qualified (flagged, uncalibrated, inconclusive) must not read as a
bare GO / NO-GO in the replay's per-checkpoint line, its table, its "Last checkpoint" summary line or the
markdown report's table: the trust goes with the decision, as in the card's headline.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from satmon.cli.replay import _summary
from satmon.replay.loop import summary_row
from satmon.results.verdict import LayerCounts, build_verdict

_OFFSET = {"ln_f": {"saturated": 0.6, "centered": 0.01, "offset_ratio": 40.0}}


def _qualified():
    """Replay verdicts the study's rule calls GO / NO-GO but whose trust is not ok, and one that is."""
    return {
        "flagged": build_verdict({"ln_f": LayerCounts(60, 100)}, step=9, source="replay", offset=_OFFSET, offset_flag=True),
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
    assert f"do not rely on this {word}" in last and "keep it" not in out


def test_a_trusted_replay_verdict_reads_as_before():
    v = build_verdict({"ln_f": LayerCounts(10, 100)}, step=9, source="replay")
    assert v.trust == "ok"
    row = summary_row({"checkpoint": "step=9.ckpt", "global_step": 9, "verdict": v.to_dict()})
    assert row["decision"] == "NO-GO"
