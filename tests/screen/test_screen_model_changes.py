"""Modules that change during the window (issue 19, item 6): a DyT replaced or added is counted from its first
forward and the card says which layer changed and at which step; a removed one keeps its counts, with a note;
checking costs no walk over the model's modules on the steps where nothing changed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from reference import exact_count
from satmon import DyT, Screen

D, T, B = 16, 8, 4  # every forward: B * T * D = 512 elements a DyT layer


class Recorder:
    """An independent float64 count of |alpha * x| > 2 on the modules it is given (their own forward hooks)."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def watch(self, name: str, module: nn.Module) -> None:
        def hook(mod, args, out):
            c = self.counts.setdefault(name, [0, 0])
            c[0] += exact_count(args[0], mod.alpha, 2.0)
            c[1] += args[0].numel()

        module.register_forward_hook(hook)


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, D), DyT(D, alpha_init=2.0), nn.Linear(D, D), DyT(D, alpha_init=2.0))


def _screen(model: nn.Module, window: int = 6) -> Screen:
    return Screen(window=window, verbose=False, watch_every_n_steps=0, warn=lambda m: None).attach(model)


def _run(model: nn.Module, screen: Screen, steps: int, change: dict) -> None:
    for step in range(steps):
        if step in change:
            change[step](model)
        model(torch.randn(B, T, 8))
        screen.step()


def test_a_dyt_replaced_mid_window_is_counted_from_its_first_forward_and_named():
    model, rec = _net(), Recorder()
    for i in (1, 3):
        rec.watch(str(i), model[i])

    def swap(m):
        m[3] = DyT(D, alpha_init=3.0)
        rec.watch("3", m[3])  # the reference counts the new module under the same name

    screen = _screen(model)
    _run(model, screen, 6, {3: swap})
    v = screen.verdict
    assert v.elements == 6 * 2 * B * T * D == 6144  # 0.2 counted 4,608 and said nothing
    for name, (sat, total) in rec.counts.items():
        assert v.per_layer[name] == sat / total
    assert v.notes == (
        "layer 3 was replaced at step 3: counted from its first forward (the replaced module's counts are kept)",
    )
    assert "layer 3 was replaced at step 3" in v.card()


def test_a_dyt_added_mid_window_is_counted_from_its_first_forward():
    model, rec = _net(), Recorder()
    for i in (1, 3):
        rec.watch(str(i), model[i])

    def grow(m):
        m.append(DyT(D, alpha_init=2.5))
        rec.watch("4", m[4])

    screen = _screen(model)
    _run(model, screen, 6, {2: grow})
    v = screen.verdict
    assert list(v.per_layer) == ["1", "3", "4"] and v.elements == (6 * 2 + 4) * B * T * D
    assert v.per_layer["4"] == rec.counts["4"][0] / rec.counts["4"][1]
    assert v.notes == ("layer 4 was added at step 2: counted from its first forward",)


@pytest.mark.parametrize("how", ["setattr", "del"])
def test_a_removed_dyt_keeps_its_counts_with_a_note(how):
    model = nn.Sequential(*_net(), nn.Identity())

    def drop(m):
        if how == "setattr":
            m[3] = nn.Identity()  # a registration: seen at once
        else:
            del m[3]  # no registration: seen when the window closes

    screen = _screen(model)
    _run(model, screen, 6, {3: drop})
    v = screen.verdict
    assert v.elements == (6 + 3) * B * T * D  # layer 3 ran 3 times, and those counts stay
    assert list(v.per_layer) == ["1", "3"]
    if how == "setattr":
        assert v.notes == (
            (
                "layer 3 was replaced by Identity (not a DyT) at step 3: its DyT counts up to then are "
                "kept, and it is not counted after"
            ),
        )
    else:
        assert v.notes == ("layer 3 was removed before step 6: its counts up to then are kept",)


def test_a_dyt_swapped_for_a_layernorm_keeps_its_counts_and_says_so():
    model, rec = _net(), Recorder()
    for i in (1, 3):
        rec.watch(str(i), model[i])

    def back(m):
        m[3] = nn.LayerNorm(D)  # a LayerNorm put back in the middle of the window: no DyT there any more

    screen = _screen(model)
    _run(model, screen, 6, {3: back})
    v = screen.verdict
    assert rec.counts["1"][1] == 6 * 512 and rec.counts["3"][1] == 3 * 512  # the reference saw only what ran
    assert v.elements == sum(t for _, t in rec.counts.values())
    assert v.saturation == sum(s for s, _ in rec.counts.values()) / v.elements
    for name, (sat, total) in rec.counts.items():
        assert v.per_layer[name] == sat / total
    assert v.notes == (
        (
            "layer 3 was replaced by LayerNorm (not a DyT) at step 3: its DyT counts up to then are kept, "
            "and it is not counted after"
        ),
    )
    assert "replaced by LayerNorm (not a DyT) at step 3" in v.card()


def test_a_dyt_moved_to_another_name_is_counted_once_under_the_name_it_runs_as():
    model, rec = _net(), Recorder()
    for i in (1, 3):
        rec.watch(str(i), model[i])

    screen = _screen(model)
    counts_before: dict = {}

    def record_then_move(m):
        counts_before.update({k: list(v) for k, v in rec.counts.items()})
        for k in rec.counts:
            rec.counts[k] = [0, 0]
        m.append(m[3])
        m[3] = nn.Identity()

    _run(model, screen, 6, {3: record_then_move})
    v = screen.verdict
    # steps 0-2: the module ran as "3"; steps 3-5: as "4" (the reference's hook on it counted both)
    sat3, tot3 = counts_before["3"]
    sat4, tot4 = rec.counts["3"]
    assert (tot3, tot4) == (3 * 512, 3 * 512)
    assert v.elements == 6 * 512 + tot3 + tot4  # counted once: 0.2's hook on the old name would count it twice
    assert v.per_layer["3"] == sat3 / tot3 and v.per_layer["4"] == sat4 / tot4


def test_no_walk_over_the_modules_on_steps_where_nothing_changed(monkeypatch):
    model = _net()
    screen = _screen(model)
    model(torch.randn(B, T, 8))  # the first training forward is read once (gating): its walks are not per step
    screen.step()
    walks = []
    for method in ("modules", "named_modules", "children", "named_children"):
        original = getattr(nn.Module, method)
        monkeypatch.setattr(
            nn.Module, method, lambda self, *a, _o=original, _m=method, **k: walks.append(_m) or _o(self, *a, **k)
        )
    for _ in range(3):  # the window's other steps before its end
        model(torch.randn(B, T, 8))
        screen.step()
    assert walks == []


def test_a_checkpoint_after_a_change_resumes_with_every_count():
    model = _net()
    screen = _screen(model)

    def grow(m):
        m.append(DyT(D, alpha_init=2.5))

    _run(model, screen, 3, {1: grow})
    state = screen.state_dict()
    assert state["layers"] == ["1", "3", "4"] and state["total"] == [3 * 512, 3 * 512, 2 * 512]
    resumed = Screen(window=6, verbose=False, watch_every_n_steps=0)
    resumed.load_state_dict(state)
    resumed.attach(model, step=3)  # the resumed model holds the added layer: every count comes back
    _run(model, resumed, 3, {})
    assert resumed.verdict.elements == (6 + 6 + 5) * B * T * D


def test_a_dyt_replaced_on_a_step_not_sampled_is_counted_on_the_sampled_steps_only():
    model, rec = _net(), Recorder()
    sampled = Recorder()  # the reference, on the steps sample_every=2 counts (0, 2, 4)
    for i in (1, 3):
        rec.watch(str(i), model[i])

    def swap(m):
        m[3] = DyT(D, alpha_init=3.0)
        rec.watch("3", m[3])

    screen = Screen(window=6, sample_every=2, verbose=False, watch_every_n_steps=0, warn=lambda m: None).attach(model)
    for step in range(6):
        if step == 3:
            swap(model)
        before = {k: list(v) for k, v in rec.counts.items()}
        model(torch.randn(B, T, 8))
        if step % 2 == 0:
            for k, (s, t) in rec.counts.items():
                c = sampled.counts.setdefault(k, [0, 0])
                c[0] += s - before.get(k, [0, 0])[0]
                c[1] += t - before.get(k, [0, 0])[1]
        screen.step()
    v = screen.verdict
    assert v.elements == sum(t for _, t in sampled.counts.values()) == 3 * 2 * 512  # step 3's forward not counted
    for name, (sat, total) in sampled.counts.items():
        assert v.per_layer[name] == sat / total
