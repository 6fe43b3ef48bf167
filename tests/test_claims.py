"""Every sentence true: no doc, docstring or card string explains GO / NO-GO in words the evidence does not support.

What GO and NO-GO say and what they are worth are worded once, in :data:`satmon.study.MEANING` and
:data:`satmon.study.WORTH`: the 0.43 rule was right on 9 of the study's 12 cells in-sample, on 50% of them
leave-one-scale-out (guessing the commoner outcome: 67%), and on 12 of 16 cells of satmon's faithful grid, exactly
as always saying NO-GO; 2 of the study's 9 cells below 0.43 were helped by DyT, and the grid's 4 helped cells all
read NO-GO. So neither word says why DyT helps or hurts, nor what to do. This test reads README.md, every
docs/*.md and every string in the package's code (docstrings and the card's words) and fails on each pattern
below, with its reason. The study's own words may be quoted only where the text says they are the study's claim:
in a markdown blockquote (lines starting with ``>``) whose first line, or the text line just before it, says
"the study's claim" (or "the study's words").
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (pattern, why the evidence does not support it). Case-insensitive.
CLAIMS: list[tuple[str, str]] = [
    (
        r"\bDyT\s+(acts|acted|act|acting)\s+as\s+a\s+(useful\s+)?regulari[sz]er",
        "GO does not show DyT regularising: the 0.43 rule is at chance held out (50% vs 67%), "
        "and satmon never measured "
        "a regularising mechanism",
    ),
    (
        r"\bregulari[sz](es|ing)\b|\bregulari[sz]er\s+(regime|at\s+work|the\s+rule\s+reads|here)|useful\s+regulari[sz]",
        "reads GO as regularisation at work: a mechanism the verdict does not measure",
    ),
    (
        r"convergence\s+penalty|slow(s|ed)?\s+convergence|cost(s)?\s+convergence|expected\s+to\s+slow",
        "NO-GO does not show slowed convergence: 2 of the study's 9 cells below 0.43 were helped by DyT",
    ),
    (
        r"switch\s+back\s+to\s+LayerNorm|keep(ing)?\s+DyT\b|LayerNorm\s+is\s+the\s+safer\s+choice|use\s+LayerNorm\s+instead",
        "an imperative (or advice) the rule's accuracy does not support; the headline gives no advice",
    ),
    (
        r"\bright(ly)?\s+here\b|the\s+call\s+is\s+right",
        "calls one demo's NO-GO right: the rule is no better than always saying NO-GO, so one "
        "agreeing run shows nothing",
    ),
    (
        r"whether\s+a\s+normali[sz]ation\s+choice\s+will\s+help\s+or\s+hurt",
        "promises a forecast of DyT's effect that no 500-step reading was shown to give",
    ),
    (
        r"Trust:\s*\**ok\**:\s*nothing\s+satmon\s+measured",
        "a stale card: a decision by the study's 0.43 is at best `unproven` (trust `ok` needs a "
        "calibration that forecasts)",
    ),
]
#: Files this test does not read, each with why.
EXEMPT = {
    "docs/plans/grid_plan.md": "a pre-registered plan, frozen at its commit (the audit compares it with the results)",
    "docs/plans/grid2_plan.md": "a pre-registered plan, frozen at its commit",
}
_QUOTE_MARK = re.compile(r"the study's (claim|words)", re.IGNORECASE)


def _doc_lines() -> list[tuple[str, int, str]]:
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        rel = path.relative_to(ROOT).as_posix()
        if rel in EXEMPT:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        quoted = _quoted(lines)
        out += [(rel, i + 1, line) for i, line in enumerate(lines) if i not in quoted]
    return out


def _quoted(lines: list[str]) -> set[int]:
    """Line indexes inside a blockquote that the text marks as the study's claim."""
    keep: set[int] = set()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith(">"):
            start = i
            while i < len(lines) and lines[i].lstrip().startswith(">"):
                i += 1
            # the line before, blanks skipped
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            if _QUOTE_MARK.search(before) or _QUOTE_MARK.search(lines[start]):
                keep.update(range(start, i))
        else:
            i += 1
    return keep


def _code_strings() -> list[tuple[str, int, str]]:
    """Every string constant in the package's code (docstrings, the card's words, messages), joined where an
    f-string or implicit concatenation splits it, one entry per line of it."""
    out = []
    for path in sorted((ROOT / "satmon").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(
                    v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}" for v in node.values
                )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            out.append((rel, node.lineno, " ".join(text.split())))
        # the attribute doc-comments (``#:``) document the package too
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.lstrip().startswith("#:"):
                out.append((rel, i, line.lstrip()[2:].strip()))
    return out


def _hits(entries: list[tuple[str, int, str]]) -> list[str]:
    found = []
    for pattern, why in CLAIMS:
        rx = re.compile(pattern, re.IGNORECASE)
        found += [
            f"{rel}:{line}: {rx.search(text).group(0)!r}: {why}" for rel, line, text in entries if rx.search(text)
        ]
    return found


def test_no_doc_explains_go_or_no_go_beyond_the_evidence():
    # a sentence can wrap: read each paragraph's lines joined as well as each line
    hits = _hits(_doc_lines())
    joined = []
    for rel, line, text in _doc_lines():
        if joined and joined[-1][0] == rel and joined[-1][3] == line - 1 and text.strip():
            prev = joined.pop()
            joined.append((rel, prev[1], prev[2] + " " + text.strip(), line))
        elif text.strip():
            joined.append((rel, line, text.strip(), line))
    hits += [h for h in _hits([(r, l, t) for r, l, t, _ in joined]) if h not in hits]
    assert not hits, (
        "wording the evidence does not support (satmon.study.MEANING and WORTH say what GO and NO-GO are):\n"
        + ("\n".join(sorted(set(hits))))
    )


def test_no_package_string_explains_go_or_no_go_beyond_the_evidence():
    hits = _hits(_code_strings())
    assert not hits, "wording the evidence does not support:\n" + "\n".join(hits)


def test_the_readme_opens_on_what_satmon_measures_and_what_it_can_and_cannot_foretell():
    text = (ROOT / "README.md").read_text()
    first = " ".join(text[text.index("\n**") :].split("**")[1].split())  # the bold opening sentence
    assert "measures" in first and "cannot" in first and "forecast" in first.lower(), first


@pytest.mark.parametrize(
    ("text", "caught"),
    [
        ("GO: DyT acts as a regulariser here", True),
        ("NO-GO: a convergence penalty; switch back to LayerNorm", True),
        ("satmon says NO-GO, rightly here", True),
        ("the paper's title: Activation Bounding as a Regime-Dependent Implicit Regularizer", False),
        ("GO: pooled saturation at or above 0.43", False),
    ],
)
def test_the_patterns_catch_the_claims_and_spare_plain_words(text, caught):
    assert bool(_hits([("x", 1, text)])) is caught


def test_a_marked_quote_of_the_study_is_allowed_and_an_unmarked_one_is_not():
    marked = ["The study's claim, in its words:", "> GO: DyT acts as a useful regulariser", "", "plain"]
    unmarked = ["Some text:", "> GO: DyT acts as a useful regulariser"]
    assert _quoted(marked) == {1} and _quoted(unmarked) == set()


#: A decision (GO, NO-GO, the rule, a threshold) called right or wrong.
_JUDGED = re.compile(
    r"\b(?:GO|NO-GO|decision|verdict|rule|threshold|0\.43)\b[^.;:]{0,80}?\b(?:is|was|were|are)\s+"
    r"(?:right|wrong|correct|incorrect)\b|\bwhich\s+is\s+(?:right|wrong|correct)\b",
    re.IGNORECASE,
)
#: What names the cells a judgement rests on: a count ("12 of 16", "9/12", "in 12", "6 times"), a rate, or the cells.
_COUNTED = re.compile(
    r"(?<![\d.])\d+\s*(?:of|/)\s*(?:the\s+|its\s+|the\s+study's\s+)?\d+(?![\d.])|\b(?:all|in|on|the)\s+(?:the\s+)?\d+(?![\d.])|\b\d+\s+times\b"
    r"|\d+(?:\.\d+)?\s*%|\bcells?\b"
)


def _judged_without_cells(text: str) -> list[str]:
    """The sentences of ``text`` (fenced code left out) that call a decision right or wrong and count no cells."""
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL).replace("\n", " ")
    return [s for s in re.split(r"(?<=[.!?])\s+", prose) if _JUDGED.search(s) and not _COUNTED.search(s)]


@pytest.mark.parametrize(
    ("sentence", "caught"),
    [
        ("satmon says NO-GO (pooled saturation 0.25), which is right at this size: LayerNorm ends lower.", True),
        ("Three seeds learn (1.94 / 1.97 / 1.97) and NO-GO (0.25), which is right at this size.", True),
        ("On the faithful grid the rule was right for the small model.", True),
        ("0.43 says GO 18 times and is right 6 times.", False),
        ("The 0.43 rule was right on 9 of the study's 12 cells in-sample.", False),
        ("The layer's weight is used, so layers that were read right stay unchanged.", False),
    ],
)
def test_a_judgement_without_cells_is_caught_and_a_counted_one_is_not(sentence, caught):
    assert bool(_judged_without_cells(sentence)) is caught


def test_every_sentence_that_calls_a_decision_right_or_wrong_names_its_cells():
    """Meaning, not phrases: a decision called right or wrong says on how many cells (one run shows nothing)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        rel = path.relative_to(ROOT).as_posix()
        if rel not in EXEMPT:
            found += [f"{rel}: {s[:160]}" for s in _judged_without_cells(path.read_text(encoding="utf-8"))]
    found += [f"{rel}:{n}: {t[:160]}" for rel, n, t in _code_strings() for _ in _judged_without_cells(t)]
    assert not found, "a decision called right or wrong without the cells it rests on:\n" + "\n".join(found)


# ----------------------------------------------------------------- counts recomputed from the data files
def _flat(rel: str) -> str:
    return " ".join((ROOT / rel).read_text(encoding="utf-8").split())


def test_what_a_decision_is_worth_is_recomputed_from_the_grids_cells():
    """satmon.study's CPU-grid counts (and so WORTH and every card) from the cells of the grids it names."""
    import json

    from satmon import study

    def grid_cells(rel: str) -> list[dict]:  # a grid's JSON, or a folder of parts holding a JSON per cell
        path = ROOT / rel
        if path.is_dir():
            return [
                json.loads(f.read_text()) for part in study.CPU_GRID_PARTS for f in sorted((path / part).glob("*.json"))
            ]
        return json.loads(path.read_text())["cells"]

    cells = [c for rel in study.CPU_GRIDS for c in grid_cells(rel)]
    no_go = [c for c in cells if c["window_saturation"] < study.THRESHOLD]
    right = sum((c["window_saturation"] >= study.THRESHOLD) == (c["delta"] < 0) for c in cells)
    assert (study.CPU_GRID_CELLS, study.CPU_GRID_NO_GO, study.CPU_GRID_RIGHT, study.CPU_GRID_HELPED) == (
        len(cells),
        len(no_go),
        right,
        sum(c["delta"] < 0 for c in cells),
    )
    assert f"NO-GO {len(no_go)} times, right in {right}" in study.WORTH
    science = _flat("docs/science/science.md")
    assert (
        f"said NO-GO in all {len(cells)} cells, right in {right} (where DyT hurt), exactly as always NO-GO, and the "
        f"{sum(c['delta'] < 0 for c in cells)} cells where DyT helped all read NO-GO"
    ) in science


def test_the_docs_configuration_counts_are_recomputed_from_the_known_cells():
    """science.md counts configurations (recipe x size x passes, seeds averaged) as satmon.forecast does."""
    from satmon.results.forecast import configurations, known_cells

    every = known_cells()
    grid2 = [c for c in every if c.source == "satmon 0.5 second CPU grid"]
    grid3 = [c for c in every if c.source == "satmon's third CPU grid"]
    first = [c for c in every if c not in grid2 and c not in grid3]
    science = _flat("docs/science/science.md")

    def counts(cells):
        cf = configurations(cells)
        few, many = [c for c in cf if c.passes <= 3.4], [c for c in cf if c.passes >= 16]
        return (
            len(cf),
            (sum(c.outcome == "hurts" for c in few), len(few)),
            (sum(c.outcome == "helps" for c in many), len(many)),
        )

    n1, few1, many1 = counts(first)
    assert (
        f"The study's 12 cells and the faithful grid's 16 are {n1} configurations: at up to 3.3 passes DyT's final "
        f"held-out loss was worse than LayerNorm's in {few1[0]} of {few1[1]}"
    ) in science
    assert f"at 16 passes and more it was better in {many1[0]} of {many1[1]}" in science
    n2, few2, many2 = counts(grid2)
    assert (
        f"30 cells in {n2} configurations) hurt in {few2[0]} of {few2[1]} at 3.3 passes and helped in {many2[0]} of "
        f"{many2[1]} at 16 passes and more"
    ) in science
    n, few, many = counts(first + grid2)
    assert (
        f"the {len(first) + len(grid2)} cells are {n} configurations: {few[0]} of {few[1]} hurt at up to 3.3 passes, "
        f"{many[0]} of {many[1]} helped at 16 and more"
    ) in science
    n3, few3, many3 = counts(grid3)
    assert f"{len(grid3)} cells in {n3} configurations" in science
    assert f"hurt in {few3[0]} of {few3[1]} at up to 3.3 passes and helped in {many3[0]} of {many3[1]} at 16" in science
    n, few, many = counts(every)
    assert (
        f"the {len(every)} cells are {n} configurations: {few[0]} of {few[1]} hurt at up to 3.3 passes, {many[0]} of "
        f"{many[1]} helped at 16 and more"
    ) in science
    # the second grid's frozen rules, per configuration, against the trivial rate on the same configurations
    from satmon.functional.significance import binomial_tail

    cf = configurations(grid2)
    helps = [c.outcome == "helps" for c in cf]
    trivial = max(sum(helps), len(cf) - sum(helps))
    for rule, said in (
        (
            lambda c: c.passes >= 51,
            '"DyT helps iff passes >= 51" was right on {k} of {n} (p = {p:.1g} against the trivial {t} of {n}',
        ),
        (
            lambda c: c.params and c.point[1] <= math.log10(0.49),
            '"iff tokens per parameter <= 0.49" on {k} of {n} (p = {p:.1g}: not shown)',
        ),
    ):
        k = sum(rule(c) == h for c, h in zip(cf, helps))
        assert said.format(k=k, n=len(cf), p=binomial_tail(k, len(cf), trivial / len(cf)), t=trivial) in science


#: A forecast called confident ("hurts"/"helps" as the forecast's answer): it must name the configurations it rests on.
_FORECAST_SAID = re.compile(
    r"\bforecast\b[^.;]{0,60}?\b(?:says|said|reads|read|gives|answers|is)\s+[\"*]*(?:hurts|helps|"
    r"confident)\b",
    re.IGNORECASE,
)
_CONFIGURATIONS = re.compile(
    r"\b\d+\s+(?:of\s+(?:the\s+)?\d+\s+)?configurations?\b|\brests_on\b|\bevidence\b", re.IGNORECASE
)


def _forecast_without_configurations(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL).replace("\n", " ")
    return [s for s in re.split(r"(?<=[.!?])\s+", prose) if _FORECAST_SAID.search(s) and not _CONFIGURATIONS.search(s)]


@pytest.mark.parametrize(
    ("sentence", "caught"),
    [
        ("At 2 passes the forecast says hurts.", True),
        ("The forecast reads **helps** at 71-91 passes.", True),
        ("The forecast says hurts at 1.4 passes, on 6 of 6 configurations (p = 0.016).", False),
        ("The forecast is uncertain there.", False),
    ],
)
def test_a_confident_forecast_without_its_configurations_is_caught(sentence, caught):
    assert bool(_forecast_without_configurations(sentence)) is caught


def test_every_sentence_that_calls_the_forecast_confident_names_its_configurations():
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        rel = path.relative_to(ROOT).as_posix()
        if rel not in EXEMPT and not rel.startswith("docs/plans/"):
            found += [f"{rel}: {s[:160]}" for s in _forecast_without_configurations(path.read_text(encoding="utf-8"))]
    assert not found, "a confident forecast without the configurations it rests on:\n" + "\n".join(found)


def test_the_studys_figures_in_satmon_study_are_recomputed_from_the_data_files():
    """HELD_OUT_ACCURACY, NO_SKILL_ACCURACY, the in-sample 9/12 and the 0.3 grid's 9/18, from the shipped cells."""
    import json
    from importlib import resources

    from satmon import study

    text = resources.files("satmon").joinpath("data_files/study_cells.csv").read_text()
    rows = [
        dict(
            zip(
                text.splitlines()[[i for i, l in enumerate(text.splitlines()) if l.startswith("name,")][0]].split(","),
                line.split(","),
            )
        )
        for line in text.splitlines()
        if line and not line.startswith(("#", "name,"))
    ]
    cells = [(r["group"], float(r["saturation"]), float(r["delta"]) < 0) for r in rows]

    def fit(train):  # the study's rule: the first midpoint with the best in-sample accuracy, GO at or above it
        xs = sorted({s for _, s, _ in train})
        mids = [(a + b) / 2 for a, b in zip(xs, xs[1:])]
        return max(mids, key=lambda t: (sum((s >= t) == h for _, s, h in train), -mids.index(t)))

    t = fit(cells)
    assert round(t, 5) == study.FIT_THRESHOLD and sum((s >= t) == h for _, s, h in cells) == 9  # in-sample 9/12
    held = sum(
        (s >= fit([c for c in cells if c[0] != g])) == h for g in {c[0] for c in cells} for gg, s, h in cells if gg == g
    )
    helped = sum(h for _, _, h in cells)
    assert (held / len(cells), len(cells)) == (study.HELD_OUT_ACCURACY, study.HELD_OUT_CELLS)
    assert max(helped, len(cells) - helped) / len(cells) == study.NO_SKILL_ACCURACY
    v03 = json.loads((ROOT / "data" / "regime_grid.json").read_text())["cells"]
    right = sum((c["window_saturation"] >= study.THRESHOLD) == (c["delta"] < 0) for c in v03)
    no_go_right = sum(c["delta"] >= 0 for c in v03)
    assert (right / len(v03), no_go_right / len(v03)) == (study.GRID_HELD_OUT_ACCURACY, study.GRID_NO_SKILL_ACCURACY)
