"""satmon.screen.state: the checkpoint state format (ScreenState), the pure resume plan (restore_plan), and a
plain loop resumed mid-window that reaches the uninterrupted run's verdict, field for field."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from satmon.demos.gpt import GPT, GPTConfig
from satmon.results.stop import StopReason, StopRecord
from satmon.results.verdict import build_verdict
from satmon.screen.screen import Screen
from satmon.screen.state import STATE_VERSION, RestorePlan, ScreenState, restore_plan
from satmon.settings import Settings

COUNTS = ((3, 0), (10, 10), (0, 0))


def _plain(value) -> bool:
    """Only the types ``torch.load(weights_only=True)`` and JSON take: dict, list, str, int, float, bool, None."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


def _state(**kw) -> ScreenState:
    fields = dict(
        settings=ScreenState.saved_settings(Settings(threshold=0.5)),
        layers=("a", "b"),
        steps_seen=4,
        first_step=0,
        notes=("an earlier note",),
        counts=COUNTS,
        extras={"loss_segments": {"sums": [1.5, 0.0], "counts": [2, 0]}},
    )
    fields.update(kw)
    return ScreenState(**fields)


def test_the_saved_form_is_plain_values_and_reads_back(tmp_path):
    verdict = build_verdict({"a": (3, 10), "b": (0, 10)}, step=4, window=4)
    state = _state(verdict=verdict, stop=StopRecord(StopReason.NO_GO, verdict.reason, 4))
    d = state.to_dict()
    # satmon 0.2's keys, in its order
    assert list(d) == [
        "version",
        "settings",
        "layers",
        "steps_seen",
        "first_step",
        "notes",
        "verdict",
        "stop",
        "saturated",
        "total",
        "nonfinite",
        "loss_segments",
    ]
    assert d["version"] == STATE_VERSION and d["saturated"] == [3, 0] and d["settings"]["threshold"] == 0.5
    assert _plain(d)
    torch.save(d, tmp_path / "s.pt")
    again = ScreenState.from_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert again == state and again.verdict == verdict


def test_an_older_state_reads_with_defaults():
    """A satmon 0.1 state: counts and a few settings, no version, layers, notes or extras."""
    old = ScreenState.from_dict(
        {
            "saturated": [1],
            "total": [4],
            "nonfinite": [0],
            "steps_seen": 2,
            "settings": {"window": 500, "level": 2.0, "product": "exact"},
        }
    )
    assert old.counts == ((1,), (4,), (0,)) and old.layers == () and old.notes == () and old.verdict is None
    assert ScreenState.from_dict({}).counts is None


@pytest.mark.parametrize(
    ("change", "kept", "restart", "warns", "note"),
    [
        ({}, True, False, False, None),
        ({"threshold": 0.43}, True, False, False, "threshold 0.43 (saved: 0.5); the counts were kept"),
        ({"collapse_threshold": 0.6}, True, False, False, "collapse_threshold 0.6 (saved: 0.5); the counts were kept"),
        (
            {"product": "exact"},
            True,
            False,
            True,
            "product 'exact' (saved: 'module'); the counts of the first 4 steps were kept",
        ),
        ({"window": 800}, True, False, True, "window 800 (saved: 500); the counts of the first 4 steps were kept"),
        (
            {"sample_every": 2},
            True,
            False,
            True,
            "sample_every 2 (saved: 1); the counts of the first 4 steps were kept",
        ),
        ({"level": 3.0}, False, True, True, "window restarted at step 4 (level 3.0 (saved: 2.0))"),
    ],
)
def test_what_each_change_of_settings_does_to_the_saved_counts(change, kept, restart, warns, note):
    now = Settings(**{"threshold": 0.5, **change})
    plan = restore_plan(_state(), now, ["a", "b"], 4)
    assert plan.counts == (COUNTS if kept else None) and plan.restart is restart
    assert plan.notes[0] == "an earlier note"  # the saved notes come first
    assert len(plan.notes) == (1 if note is None else 2) and (note is None or note in plan.notes[1])
    assert bool(plan.warnings) is warns
    for w in plan.warnings:  # old and new values, named
        assert all(f"{k} {v!r}" in w for k, v in change.items())


def test_a_made_verdict_or_no_counts_leave_nothing_to_plan():
    verdict = build_verdict({"a": (3, 10)}, step=4, window=4)
    assert restore_plan(_state(verdict=verdict), Settings(level=3.0), ["a", "b"], 4) == RestorePlan(
        COUNTS, notes=("an earlier note",)
    )
    assert restore_plan(_state(counts=None), Settings(level=3.0), ["a", "b"], 4).counts is None


@pytest.mark.parametrize(
    ("layers", "said"),
    [(["a"], "removed b"), (["a", "b", "c"], "added c"), (["b", "a"], "the same ones in another order")],
)
def test_another_set_of_layers_drops_the_counts_with_one_warning_naming_the_change(layers, said):
    """0.2 raised a RuntimeError out of trainer.fit: a resume with exclude= adding a layer stopped training."""
    plan = restore_plan(_state(), Settings(threshold=0.5), layers, 4)
    assert plan.counts is None and plan.restart and plan.dropped == f"another set of DyT layers ({said})"
    assert len(plan.warnings) == 1 and f"({said}): the saved counts were made on other layers" in plan.warnings[0]
    assert "window restarts counting at step 4 (496 of its 500 steps remain)" in plan.warnings[0]


def test_a_dropped_count_with_the_window_over_says_there_is_no_verdict():
    plan = restore_plan(_state(), Settings(threshold=0.5, level=3.0, window=4), ["a"], 4)
    assert plan.counts is None and plan.restart and len(plan.warnings) == 1
    assert "the 4-step window is over at step 4: nothing is left to count, so there is no verdict" in plan.warnings[0]
    assert (
        "level 3.0 (saved: 2.0)" in plan.dropped and "removed b" in plan.dropped and "restarts" not in plan.warnings[0]
    )


def test_another_set_of_layers_after_the_verdict_keeps_it_and_restores_no_counts():
    plan = restore_plan(
        _state(verdict=build_verdict({"a": (3, 10)}, step=4, window=4)), Settings(threshold=0.5), ["c"], 4
    )
    assert plan.counts is None and not plan.restart and not plan.warnings
    assert "the verdict was made on the saved layers" in plan.notes[-1]


# ------------------------------------------------------------------------ a plain loop, resumed
WINDOW, STEPS = 6, 8


def _batches() -> torch.Tensor:
    return torch.randint(0, 256, (STEPS, 4, 17), generator=torch.Generator().manual_seed(0))


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=8.0))


def _train(model, opt, screen: Screen, batches, start: int, stop: int) -> None:
    for step in range(start, stop):
        x, y = batches[step, :, :-1], batches[step, :, 1:]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        screen.end_step(step + 1, loss)
        screen.begin_step(step + 1)


def _run(resume_at: int | None, **resume_settings) -> tuple[Screen, dict]:
    batches, model = _batches(), _model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
    options = dict(window=WINDOW, watch_every_n_steps=2, offset_every=2, verbose=False)
    screen = Screen(**options).attach(model, example_input=batches[0, :, :-1])
    if resume_at is None:
        _train(model, opt, screen, batches, 0, STEPS)
        return screen, {}
    _train(model, opt, screen, batches, 0, resume_at)
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "satmon": screen.state_dict()})
    screen.detach()
    model = _model()
    model.load_state_dict(saved["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
    opt.load_state_dict(saved["opt"])
    again = Screen(**{**options, **resume_settings})
    again.load_state_dict(saved["satmon"])
    assert again.state_dict() == saved["satmon"]  # before attach: passes through whole, with the counts' settings
    again.attach(model, step=resume_at, example_input=batches[0, :, :-1])
    _train(model, opt, again, batches, resume_at, STEPS)
    return again, saved["satmon"]


@pytest.fixture(scope="module")
def uninterrupted() -> Screen:
    return _run(None)[0]


def test_a_mid_window_resume_reaches_the_uninterrupted_verdict(uninterrupted):
    resumed, saved = _run(3)
    assert saved["steps_seen"] == 3 and sum(saved["total"]) > 0 and saved["loss_segments"]["counts"][0] > 0
    assert resumed.verdict.to_dict() == uninterrupted.verdict.to_dict()  # counts, loss trend, offsets: all of them
    assert resumed.verdict.loss and resumed.verdict.offset


def test_a_resume_with_another_level_counts_only_the_steps_after_it(uninterrupted):
    with pytest.warns(UserWarning, match="the saved counts were made by another rule"):
        resumed, _ = _run(3, level=2.5)
    v = resumed.verdict
    assert resumed.first_step == 3 and v.window == WINDOW - 3 and v.level == 2.5
    assert v.elements * 2 == uninterrupted.verdict.elements  # the same number of elements per step, half the steps
    assert any("window restarted at step 3" in n for n in v.notes)
