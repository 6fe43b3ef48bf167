"""Every number the FAQ and science.md give about the LLaMA final-norm trap, read back from the data files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from satmon.cli.demo import LLAMA

ROOT = Path(__file__).resolve().parents[2]


def _json(name: str) -> dict:
    return json.loads((ROOT / "data" / name).read_text())


def _text(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())  # markdown line breaks as spaces


def _runs(data: dict) -> dict[tuple[str, int], dict]:
    return {(r["arm"], r["seed"]): r for r in data["runs"]}


@pytest.fixture(scope="module")
def bench() -> dict:
    return _json("llama_final_norm.json")


def test_the_measurement_is_of_the_demo_recipe_with_its_provenance(bench):
    assert {k: bench["settings"][k] for k in LLAMA} == LLAMA  # satmon demo --arch llama's model, optimizer and data
    assert bench["settings"]["steps"] == 500 and bench["environment"]["satmon_commit"].isalnum()
    assert {(r["arm"], r["seed"]) for r in bench["runs"]} >= {
        (a, s) for a in ("dyt", "rmsnorm", "dyt-final") for s in (11, 6)
    }


def test_the_faq_numbers_are_the_data_files(bench):
    faq, r, f = _text("docs/guides/faq.md"), _runs(bench), "{:.4f}".format
    loss = {k: v["final_val_loss"] for k, v in r.items()}
    assert (
        f"the held-out loss ends at {f(loss['dyt-final', 11])} and {f(loss['dyt-final', 6])} nats/byte against a "
        f"byte-frequency level of {f(bench['unigram_loss'])}"
    ) in faq
    assert (
        f"learns: {f(loss['dyt', 11])} and {f(loss['dyt', 6])} at step 500 in the same two seeds, against "
        f"{f(loss['rmsnorm', 11])} and {f(loss['rmsnorm', 6])} for RMSNorm everywhere, so DyT in the blocks costs "
        f"{loss['dyt', 11] - loss['rmsnorm', 11]:.2f} and {loss['dyt', 6] - loss['rmsnorm', 6]:.2f} nats/byte"
    ) in faq
    assert (
        f"alpha 1 and 2 before the head end at {f(loss['dyt-final-a1', 11])} and {f(loss['dyt-final-a2', 11])} "
        f"(seed 11) and at {f(loss['dyt-final-a1', 6])} and {f(loss['dyt-final-a2', 6])} (seed 6)"
    ) in faq
    late = {k: [t for t in v["trace"] if t["step"] >= 100] for k, v in r.items()}
    assert all([t["step"] for t in v] == list(range(100, 501, 50)) for v in late.values())
    exact = {
        k: all(t["final_tanh_at_pm1"] == 1.0 and t["max_grad_embedding"] == 0.0 == t["max_grad_blocks"] for t in v)
        for k, v in late.items()
        if k[0].startswith("dyt-final")
    }
    assert exact == {
        ("dyt-final", 11): True,
        ("dyt-final", 6): False,
        ("dyt-final-a1", 11): True,
        ("dyt-final-a1", 6): True,
        ("dyt-final-a2", 11): True,
        ("dyt-final-a2", 6): True,
    }
    seed6 = late["dyt-final", 6]
    share = [t["final_tanh_at_pm1"] for t in seed6]
    assert f"seed 6 {min(share):.1%}"[:-1] + f"-{max(share):.1%} of its elements are at +-1" in faq
    assert f"at most {max(max(t['max_grad_embedding'], t['max_grad_blocks']) for t in seed6):.1e}" in faq
    # "learns", well below the byte frequencies
    assert all(loss["dyt", s] < bench["unigram_loss"] - 1.0 for s in (11, 6))


def test_the_science_numbers_are_the_data_files():
    science, f = _text("docs/science/science.md"), "{:.4f}".format
    gelu = _json("llama_final_norm_gelu.json")
    r = _runs(gelu)
    assert (
        f"is trapped too ({f(r['dyt-final-gelu', 11]['final_val_loss'])} nats/byte at step 500, seed 11, against "
        f"{f(gelu['unigram_loss'])} for the byte frequencies; the same GELU model with RMSNorm before the head: "
        f"{f(r['dyt-gelu', 11]['final_val_loss'])})"
    ) in science
    pilot = _json("collapse_pilot.json")
    u = pilot["unigram_loss"]
    dyt = [next(a for a in run["arms"] if a["arm"] == "dyt") for run in pilot["runs"]]
    best = [min(v for _, v in a["curve"] if v is not None) for a in dyt]
    never = sum(b >= 0.9 * u for b in best)
    lost = sum(b < 0.9 * u and a["curve"][-1][1] >= 0.9 * u for a, b in zip(dyt, best))
    assert (never, len(dyt) - never, lost) == (11, 7, 0)
    assert (
        f"of its {len(dyt)} DyT runs, {never} never went below 0.9 of the unigram level in {pilot['steps']:,} steps "
        f"and the other {len(dyt) - never} only after a long stall; none learned and then lost it"
    ) in science
    label = pilot["pilot"]
    assert label["scored"] is False and label["final_norm"] == "dyt" and label["seed"] == 100
    checks = label["reproduced"]["runs"]
    assert len(checks) == 2 and all(c["same_as_this_file"] for c in checks)
    zero_from = {
        c["config"]["alpha"]: min(s for s, _, _ in c["trap"] if all(g == 0 for t, g, _ in c["trap"] if t >= s))
        for c in checks
    }
    assert zero_from == {2.0: 110, 8.0: 40}
    assert (
        "Two of them re-run to step 200 (the file's numbers reproduced to the last digit) pass exactly 0 gradient "
        "below the head from step 40 (`alpha_init` 8) and from step 110 (`alpha_init` 2)"
    ) in science
    assert "exactly 0 from step 40 (alpha_init 8) and from step 110 (alpha_init 2" in label["trap"]


def test_the_grid_guide_numbers_are_the_grid_check():
    grid, guide = _json("llama_grid_final_norm.json"), _text("docs/guides/grid.md")
    cells = {c["vary"]["final_norm"]: c for c in grid["cells"]}
    assert grid["config"]["steps"] == 300 and grid["config"]["warmup"] == 120 and grid["config"]["seeds"] == [0]
    dyt, trapped, ref = (
        cells["rmsnorm"]["arms"]["dyt"]["val_loss"],
        cells["dyt"]["arms"]["dyt"]["val_loss"],
        cells["rmsnorm"]["arms"]["rmsnorm"]["val_loss"],
    )
    assert cells["dyt"]["arms"]["rmsnorm"]["val_loss"] == ref  # the reference arm does not depend on final_norm
    assert (
        f"the `dyt` arm ends at {dyt:.4f} by default and at {trapped:.4f} with `final_norm=dyt`, the `rmsnorm` "
        f"arm at {ref:.4f}"
    ) in guide


def test_the_trap_remedy_satmon_prints_is_the_data_files(bench):
    """The words the console and the card give a trapped run (satmon.results.trap.REMEDY) quote the measurement on this
    tree: every loss in them is a run of data/llama_final_norm.json, rounded as printed."""
    import re

    from satmon.results.trap import REMEDY

    r, f = _runs(bench), "{:.2f}".format
    quoted = re.findall(r"\d\.\d\d(?=\D)", REMEDY.split("The option")[0])  # the LLaMA sentence
    expected = [
        f(r[("dyt", 11)]["final_val_loss"]),
        f(r[("dyt", 6)]["final_val_loss"]),
        f(r[("dyt-final", 11)]["final_val_loss"]),
        f(r[("dyt-final", 6)]["final_val_loss"]),
        f(bench["unigram_loss"]),
    ]
    assert quoted == expected
    # "at final alpha 0.2, 1 and 2 alike"
    assert all(
        r[(a, s)]["final_val_loss"] > 0.95 * bench["unigram_loss"]
        for a in ("dyt-final-a1", "dyt-final-a2")
        for s in (11, 6)
    )
