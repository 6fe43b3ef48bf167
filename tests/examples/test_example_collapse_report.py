"""The collapse grid's report (examples/collapse_report.py): the block in docs/science/abort_policy.md and the counts
satmon.study states are what the frozen scoring computes from the committed cells (data/collapse); the remedy's count
on hand-made configurations with a known answer; a cell from another commit is listed, not scored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import load_example
from satmon import study

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "collapse"


@pytest.fixture(scope="module")
def cr():
    return load_example("collapse_report")


@pytest.fixture(scope="module")
def cells(cr):
    return cr.read_cells(DATA)


def _key(size, alpha, final, lr):
    return str((size, (("alpha_init", alpha), ("final_norm", final), ("lr", lr)), "dyt"))


def _conf(size, alpha, final, lr, outcomes):
    kinds = set(outcomes)
    return {
        "config": _key(size, alpha, final, lr),
        "seed_outcomes": list(outcomes),
        "outcome": kinds.pop() if len(kinds) == 1 else "split",
    }


def test_remedy_counts_the_one_setting_neighbours_of_flagged_failures(cr):
    f1 = _conf("d64L2", "8", "rmsnorm", "0.03", ["fell behind"])
    f2 = _conf("d64L2", "8", "dyt", "0.03", ["never learned", "never learned"])
    configs = [
        f1,
        f2,
        _conf("d64L2", "8", "rmsnorm", "0.01", ["healthy"]),  # f1's lower lr: healthy
        _conf("d64L2", "8", "rmsnorm", "0.003", ["fell behind"]),  # f1's lower lr too, not healthy (any one counts)
        _conf("d64L2", "2", "rmsnorm", "0.03", ["learned then lost"]),  # f1's lower alpha_init: not healthy
        _conf("d64L4", "8", "rmsnorm", "0.01", ["healthy"]),  # another size: never a neighbour
        _conf("d64L2", "8", "dyt", "0.01", ["never learned"]),  # f2's lower lr: not healthy
        _conf("d64L2", "4", "rmsnorm", "0.01", ["healthy"]),  # two settings from f1: not a neighbour
    ]
    flagged = {c["config"]: c in (f1, f2) for c in configs}
    got = {r["change"]: (r["healthy"], r["of"]) for r in cr.remedy(configs, flagged)}
    assert got == {
        "lr lower": (1, 2),
        "alpha_init lower": (0, 1),
        "final norm rmsnorm -> dyt": (0, 1),
        "final norm dyt -> rmsnorm": (0, 1),
    }
    # a failure nobody flagged gives no remedy row; a healthy flagged configuration neither
    assert cr.remedy(configs, {}) == []


def test_a_cell_from_another_commit_is_listed_not_scored(cr, tmp_path, cells):
    scored, _ = cells
    src = DATA / "b"
    one = sorted(p for p in src.glob("*.json"))[0]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cell = json.loads(one.read_text())
    cell["code"] = "0" * 40
    (tmp_path / "b" / one.name).write_text(json.dumps(cell))
    shutil.copy(sorted(src.glob("*.json"))[1], tmp_path / "b")
    got, refused = cr.read_cells(tmp_path)
    assert len(got["b"]) == 1 and len(refused) == 1 and "0000000" in refused[0] and one.name in refused[0]
    assert len(cr.missing(got)) == len(cr.planned_names("a")) + len(cr.planned_names("b")) - 1


def test_every_planned_cell_is_in_and_scored(cr, cells):
    scored, refused = cells
    assert refused == []
    assert cr.missing(scored) == []
    assert len(scored["a"]) == 36 and len(scored["b"]) == 16


def test_the_docs_block_is_what_the_cells_give(cr, cells):
    """docs/science/abort_policy.md's block (regenerate: `python examples/collapse_report.py data/collapse
    --update-docs --figures docs/img`)."""
    text = (ROOT / "docs" / "science" / "abort_policy.md").read_text(encoding="utf-8")
    start, end = text.index(cr.MARKERS[0]) + len(cr.MARKERS[0]), text.index(cr.MARKERS[1])
    assert text[start:end].strip() == cr.markdown(*cells).strip()
    for outcome in cr.FIGURE_OUTCOMES:
        assert (ROOT / "docs" / "img" / f"collapse_{outcome.replace(' ', '_')}.png").is_file()


def test_satmon_study_states_the_grids_counts(cr, cells):
    rec = cr.record(cells[0])
    assert study.COLLAPSE_GRID_CONFIGURATIONS == rec["configurations"]
    assert study.COLLAPSE_GRID_WINDOW == tuple(rec["window"])
    assert study.COLLAPSE_GRID_WATCH == tuple(rec["watch"])
    assert study.COLLAPSE_GRID_WATCH_LATE == tuple(rec["watch_late"])
    assert study.COLLAPSE_GRID_LOSS_RULE == tuple(rec["loss_rule"])
    assert study.COLLAPSE_GRID_TRAP == tuple(rec["trap"])
    assert study.COLLAPSE_GRID_TRAP_LOSS_RULE == tuple(rec["trap_loss_rule"])
    assert study.COLLAPSE_GRID_TRAP_HEALTHY == rec["trap_healthy"]
    assert study.COLLAPSE_GRID_REMEDY == tuple(tuple(r) for r in rec["remedy_watch"])
    assert study.COLLAPSE_GRID_TRAP_REMEDY == tuple(tuple(r) for r in rec["remedy_trap"])
    assert study.COLLAPSE_GRID_GELU == tuple(rec["gelu"])


def test_watch_step_recomputes_patience_cadence_and_start_from_the_checks(cr):
    sat = [(101, 0.6), (151, 0.4), (201, 0.7), (251, 0.8), (301, 0.9), (351, 0.2), (401, 0.55)]
    w = {"checks": [{"step": s, "gated_saturation": v} for s, v in sat]}
    assert cr.watch_step(w, 101, 50, 1) == 101
    assert cr.watch_step(w, 101, 50, 2) == 251  # 151 breaks the first streak
    assert cr.watch_step(w, 101, 50, 3) == 301
    assert cr.watch_step(w, 101, 100, 2) == 201  # reads 101, 201, 301, 401 only
    assert cr.watch_step(w, 151, 100, 1) == 251  # reads 151, 251, 351
    assert cr.watch_step(w, 351, 50, 1) == 401
    assert cr.watch_step(w, 101, 50, 1, level=0.95) is None
    assert cr.watch_step({"checks": [{"step": 101, "gated_saturation": None}]}, 101, 50, 1) is None


def test_the_watch_settings_first_row_is_the_watch_the_grid_ran(cr, cells):
    """The recomputed watch at the grid's own settings (start 101, every 50, patience 1) is the recorded flag."""
    scored, _ = cells
    all_cells = [c for part in cr.PLANNED for c in scored[part]]
    first = cr.watch_settings(all_cells)[0]
    assert (first["start"], first["every"], first["patience"]) == (101, 50, 1)
    recorded = cr._flag_rows(cr.scored_report(scored), None, "dyt")["watch"]["failed or behind"]
    for k in ("hits", "configurations", "false_stops", "healthy", "lead", "wasted"):
        assert first[k] == recorded[k], k


def test_the_plans_own_command_gave_the_committed_report(cr, cells):
    """data/collapse/collapse_report.json is what the plan's scoring command wrote (docs/science/abort_policy.md gives
    the command); the report block reads the same numbers from the same cells."""
    got = json.loads((DATA / "collapse_report.json").read_text())
    assert json.loads(json.dumps(cr.scored_report(cells[0])))["lengths"] == got["lengths"]


def _words(text: str) -> str:
    return " ".join(text.replace("\n> ", "\n").split())


def test_the_docs_quote_satmon_study_and_the_cells_bear_out_the_prose(cr, cells):
    """docs/science/abort_policy.md quotes the record, the remedy and the trap's record as satmon.study words them, and
    the counts its prose adds are what the cells give."""
    doc = _words((ROOT / "docs" / "science" / "abort_policy.md").read_text(encoding="utf-8"))
    for sentence in (study.COLLAPSE_RECORD, study.COLLAPSE_REMEDY, study.TRAP_RECORD):
        assert sentence[0].upper() + sentence[1:] + "." in doc
    scored, _ = cells
    all_cells = [c for part in cr.PLANNED for c in scored[part]]
    ca = cr.ca
    full = cr._configs(cr.scored_report(scored), None, "dyt")
    kinds = {}
    for c in full:
        kinds.setdefault(c["outcome"], []).append(cr._config_parts(c["config"]))
    # never learned: 5, every one with DyT before the head
    assert len(kinds[ca.NEVER_LEARNED]) == 5 and {p["final_norm"] for p in kinds[ca.NEVER_LEARNED]} == {"dyt"}
    assert "**Never learned** (5 configurations, every one with DyT before the head" in doc
    # learned then lost: no configuration; three seeds of the gated arm, best 0.81-0.89 x U, flagged at 101,
    # 599 to 1,049 steps before the loss rule; one GELU seed
    assert ca.LOST not in kinds
    lost = [(a, ca.label_arm(a)) for a in ca.arms_of(all_cells)]
    lost = [(a, lab) for a, lab in lost if lab["outcome"] == ca.LOST]
    gated = [(a, lab) for a, lab in lost if a["arm"] == "dyt"]
    assert len(gated) == 3 and sum(a["arm"] == "dyt-gelu" for a, _ in lost) == 1
    best = [min(v for _, v in a["val_curve"] if v is not None) / a["unigram"] for a, _ in gated]
    assert f"{min(best):.2f}-{max(best):.2f}" == "0.81-0.89"
    assert {lab["flags"]["watch"] for _, lab in gated} == {101}
    leads = sorted(lab["loss_rule"] - 101 for _, lab in gated)
    assert (leads[0], leads[-1]) == (599, 1049) and "599 to 1,049 steps before the loss rule" in doc
    # fell behind: 3 configurations, all d64L4 with an RMSNorm final norm, the watch on all 3, the loss rule on none
    behind = kinds[ca.BEHIND_LABEL]
    assert len(behind) == 3 and {(p["size"], p["final_norm"]) for p in behind} == {("d64L4", "rmsnorm")}
    rows = cr._flag_rows(cr.scored_report(scored), None, "dyt")
    assert rows["watch"][ca.BEHIND_LABEL]["hits"] == 3 and rows["loss rule"][ca.BEHIND_LABEL]["hits"] == 0
    # the GELU control: 7 behind, 4 split
    gelu = cr._tally(cr._configs(cr.scored_report(scored), None, "dyt-gelu"))
    assert (gelu["behind"], gelu["split"]) == (7, 4) and "(7 configurations, 4 more split)" in doc
    # healthy: 9, the watch stopped 1; split: 9
    assert len(kinds[ca.HEALTHY]) == 9 and len(kinds["split"]) == 9
    assert rows["watch"]["failed or behind"]["false_stops"] == 1
    assert "9 of the 26 gated configurations are split" in doc and study.COLLAPSE_GRID_CONFIGURATIONS == 26
    assert rows["watch"][ca.NEVER_LEARNED]["hits"] == 5 and rows["window"][ca.NEVER_LEARNED]["hits"] == 4
    assert "The watch flagged all 5 as well and the window's verdict 4" in doc
    # the healthy configuration the watch stopped: its checks at or above 0.5, and seed 21's distance to the reference
    stopped = [
        a
        for a in ca.arms_of(all_cells)
        if a["arm"] == "dyt"
        and a["size"] == "d64L2"
        and dict(a["config"][1]) == {"alpha_init": "8", "final_norm": "rmsnorm", "lr": "0.01"}
    ]
    high = {
        a["seed"]: [c["step"] for c in a["record"]["watch"]["checks"] if c["gated_saturation"] >= 0.5] for a in stopped
    }
    assert (high[21][0], high[21][-1], high[22][0], high[22][-1]) == (101, 1051, 351, 651)
    assert high[21] == list(range(101, 1052, 50)) and high[22] == list(range(351, 652, 50))
    ratio = {a["seed"]: a["val_curve"][-1][1] / a["reference_curve"][-1][1] for a in stopped}
    assert f"{100 * (ratio[21] - 1):.1f}%" == "8.7%" and ratio[22] < 1
    assert (
        "from step 101 to 1,051 on seed 21, which ended 8.7% above" in doc and "from step 351 to 651 on seed 22" in doc
    )
    # the cadence row: 31 of the watch's 33 single-seed flags at its first check
    seeds = [ca.label_arm(a)["flags"]["watch"] for a in ca.arms_of(all_cells) if a["arm"] == "dyt"]
    fired = [f for f in seeds if f is not None]
    assert (sum(f == 101 for f in fired), len(fired)) == (31, 33)
    assert "31 of the watch's 33 flags on single seeds came at its first check (step 101)" in doc


def test_science_md_s_count_of_split_trap_configurations(cr, cells):
    """docs/science/science.md: with DyT before the head at 3e-3, 3 of the grid's 4 configurations split by seed."""
    full = cr._configs(cr.scored_report(cells[0]), None, "dyt")
    low = [
        c
        for c in full
        if cr._config_parts(c["config"])["final_norm"] == "dyt" and cr._config_parts(c["config"])["lr"] == "0.003"
    ]
    assert (sum(c["outcome"] == "split" for c in low), len(low)) == (3, 4)
    text = " ".join((ROOT / "docs" / "science" / "science.md").read_text(encoding="utf-8").split())
    assert "with DyT before the head at the lower rate 3e-3, 3 of its 4 configurations split" in text


def test_a_broken_or_foreign_file_is_listed_and_no_cells_is_a_clear_error(cr, tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "d64L2_x.0123456789ab.json").write_text("{not json")
    (tmp_path / "b" / "d64L2_y.0123456789ab.json").write_text('{"code": "x"}')
    scored, refused = cr.read_cells(tmp_path)
    assert scored == {"a": [], "b": []} and len(refused) == 2
    assert "not a readable cell (JSONDecodeError" in refused[0] and "not a grid cell" in refused[1]
    with pytest.raises(SystemExit, match="Expected scored cells in .*got none .*2 not scored"):
        cr.main([str(tmp_path), "--markdown"])
    assert cr.main([str(tmp_path)]) in (0, None)  # the listing says what is wrong and what is missing
    out = capsys.readouterr().out
    assert out.count("not scored: ") == 2 and "0 cells scored" in out
