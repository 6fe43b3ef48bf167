"""``watch_from``: the collapse watch starts before the window's end (the warm-up's end by default when the run's
warm-up is given) and runs beside the window's counting without changing anything the window measures.

A plain loop (satmon.Screen) on a hand-built gated model: an input projection, a DyT with a large alpha feeding a
SwiGLU-style MLP ``down(silu(gate(h)) * up(h))`` (the gated layer: its saturation is near 1), and a final DyT with a
small alpha before the head (not gated: the watch must leave it out). Each check is compared with a float64 recount of
``|alpha * x| > 2`` over the gated DyT's inputs of the checked step, recorded by hooks of the test's own.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from test_watch import llama
from torch import nn

from helpers import RecordingSink, token_loader, trainer
from reference import InputRecorder, counts_of, gate_stats
from satmon import DyT, SaturationMonitor, Settings, StopReason
from satmon.functional.gate import flat_threshold
from satmon.screen.screen import Screen

D, WINDOW, EVERY, STEPS = 8, 10, 3, 14


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = DyT(D, alpha_init=50.0)  # |50 x| > 2 unless |x| < 0.04: nearly every element saturates
        self.gate, self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        with torch.no_grad():
            self.gate.bias.fill_(
                -4.0
            )  # about half the gates in SiLU's flat tail (below -4.08): a flat fraction to read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Gated(nn.Module):
    def __init__(self, final_alpha: float = 0.5) -> None:
        super().__init__()
        self.inp, self.block = nn.Linear(4, D), Block()
        self.final, self.head = DyT(D, alpha_init=final_alpha), nn.Linear(D, 3)  # not gated: out of the watch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.final(self.block(self.inp(x))))


def _scalars(sink: RecordingSink) -> list[tuple[dict, int]]:
    return [(c[1], c[2]) for c in sink.calls if c[0] == "scalars"]


def _batches() -> torch.Tensor:
    return torch.randn(STEPS, 5, 4, generator=torch.Generator().manual_seed(1))


def _train(screen: Screen, model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[int]:
    """The plain loop; returns the steps trained (it stops when the screen says so)."""
    batches, done = _batches(), []
    for i in steps:
        loss = model(batches[i]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        done.append(i + 1)
        if screen.step(loss):
            break
    return done


def _run(
    steps: int = STEPS, final_alpha: float = 0.5, traced: bool = True, **options
) -> tuple[Screen, Gated, InputRecorder, list[int], dict]:
    torch.manual_seed(0)
    model = Gated(final_alpha)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    options = {"window": WINDOW, "watch_every_n_steps": EVERY, "product": "exact", **options}
    screen = Screen(info=lambda line: None, warn=lambda line: None, sink=RecordingSink(), **options)
    # gating traced before the first step, or (traced=False) read from the first training forward
    screen.attach(model, example_input=torch.randn(2, 4) if traced else None)
    gates: dict[str, list[torch.Tensor]] = {"gate": [], "hidden": []}
    model.block.gate.register_forward_hook(lambda m, a, out: gates["gate"].append(out.detach().double()))
    model.block.down.register_forward_pre_hook(lambda m, a: gates["hidden"].append(a[0].detach().double()))
    recorder = InputRecorder(model, ["block.norm", "final"])
    done = _train(screen, model, opt, range(steps))
    return screen, model, recorder, done, gates


def _measured(verdict) -> dict:
    """The verdict without its notes (what the watches said of the run): what the window measured and decided."""
    return {k: v for k, v in verdict.to_dict().items() if k != "notes"}


def _expected_checks(start: int, steps: int) -> list[int]:
    """The steps a check reads (steps done when it ends): the optimizer step after each watched step ``s``
    (``s`` steps done before it; ``s >= start`` and a multiple of EVERY)."""
    return [s + 1 for s in range(steps) if s >= start and s % EVERY == 0]


@pytest.mark.parametrize("traced", [True, False], ids=["gating traced at attach", "gating from the first forward"])
def test_in_window_checks_happen_at_the_expected_steps_and_read_the_gated_layers_of_that_step(traced):
    screen, _, recorder, _, gates = _run(watch_from=2, traced=traced)
    assert screen.settings.watch_start == 2
    log = screen.watch.log
    assert [r["step"] for r in log] == _expected_checks(2, STEPS) == [4, 7, 10, 13]  # 4, 7, 10 inside the window
    for r in log:
        i = r["step"] - 1  # the checked step's forward (one forward per step)
        sat, total = counts_of([recorder.inputs["block.norm"][i]])  # the gated DyT only: "final" feeds no gate
        assert r["gated_saturation"] == sat / total
        assert 0.8 < r["gated_saturation"] < 1  # the large alpha: saturation is near 1, as known
    # the gate statistics of an in-window check come from the watch's own hooks, for that step only
    flat, hidden = gate_stats(gates["gate"][3], gates["hidden"][3], flat_threshold("silu"))
    logged = {tag: v for values, step in _scalars(screen.sink) if step == 4 for tag, v in values.items()}
    assert logged["satmon_collapse/saturation"] == log[0]["gated_saturation"]
    assert 0 < flat < 1 and logged["satmon_collapse/flat_fraction/block"] == pytest.approx(flat, abs=1e-12)
    assert logged["satmon_collapse/mean_abs_hidden/block"] == pytest.approx(hidden, rel=1e-9)


def test_the_window_verdict_is_bit_identical_with_an_early_watch():
    default, *_ = _run()
    early, *_ = _run(watch_from=1)
    assert [r["step"] for r in default.watch.log] == _expected_checks(WINDOW, STEPS) == [13]
    assert [r["step"] for r in early.watch.log][:3] == [4, 7, 10]
    a, b = default.verdict, early.verdict
    # every measured field is the same; the notes say each run's first collapse-watch flag (step 13, step 4)
    assert _measured(a) == _measured(b)
    assert [n.split(":")[0] for n in a.notes] == ["the collapse watch flagged step 13"]
    assert [n.split(":")[0] for n in b.notes] == ["the collapse watch flagged step 4"]
    assert a.saturation == b.saturation and dict(a.per_layer) == dict(b.per_layer)
    assert a.risk == b.risk and a.risk["block"]["flat_fraction"] == b.risk["block"]["flat_fraction"]
    assert a.offset == b.offset
    # the running scalars of the window too (the watch's are under satmon_collapse/)
    window_tags = [
        [(step, {k: v for k, v in values.items() if not k.startswith("satmon_collapse")}) for values, step in calls]
        for calls in (_scalars(default.sink), _scalars(early.sink))
    ]
    assert [c for c in window_tags[0] if c[1]] == [c for c in window_tags[1] if c[1]]


def test_abort_on_collapse_stops_in_the_window_at_the_first_due_check_with_patience():
    screen, _, recorder, done, _ = _run(watch_from=2, abort_on="collapse", patience=2)
    # checks at 4 and 7 breach (saturation near 1 >= 0.5); patience 2: due at the second, inside the window
    assert screen.stop.reason is StopReason.COLLAPSE_RISK and screen.stop.step == 7 and not screen.stop.dry_run
    assert done[-1] == 7 and screen.verdict is None and [r["step"] for r in screen.watch.log] == [4, 7]
    assert "for 2 consecutive checks" in screen.stop.message
    screen.finish()  # training ended: the provisional verdict counts every step trained, the stopped one too
    counted = {name: counts_of(items) for name, items in recorder.inputs.items()}
    assert screen.verdict.partial and screen.verdict.window == 7
    assert screen.verdict.elements == sum(total for _, total in counted.values())


def test_a_stop_at_the_windows_last_step_still_makes_the_full_verdict():
    default, *_ = _run(steps=WINDOW)
    # watch_from 9: the one in-window check reads step 10, the window's last; it stops the run there
    screen, *_, done, _ = _run(watch_from=9, abort_on="collapse")
    assert screen.stop.step == 10 and done[-1] == 10 and [r["step"] for r in screen.watch.log] == [10]
    assert not screen.verdict.partial and _measured(screen.verdict) == _measured(default.verdict)
    assert [n.split(":")[0] for n in screen.verdict.notes] == ["the collapse watch flagged step 10"]


def test_dry_run_records_the_would_be_stop_in_the_window_and_trains_on():
    screen, *_, done, _ = _run(watch_from=2, abort_on="collapse", dry_run=True)
    assert screen.stop.dry_run and screen.stop.reason is StopReason.COLLAPSE_RISK and screen.stop.step == 4
    assert done[-1] == STEPS and screen.verdict is not None and screen.verdict.window == WINDOW
    stops = [c[3] for c in screen.sink.calls if c[0] == "text" and c[1] == "satmon/stop"]
    assert stops[0] == 4


def test_the_verdicts_breach_does_not_lengthen_a_streak_the_window_began():
    # patience 3: checks at 4, 7, 10 (in the window) breach; the verdict at 10 counts once with them, not twice
    screen, *_, done, _ = _run(watch_from=2, abort_on="collapse", patience=3)
    assert screen.stop.step == 10 and [r["step"] for r in screen.watch.log] == [4, 7, 10]
    assert screen.watch.streak[StopReason.COLLAPSE_RISK] == 3
    # patience 4, window 11: checks at 4, 7, 10 make 3; the collapse-risk verdict at 11 does not make it 4 (it waits
    # for the watch's confirmation, as with more patience it always has); the check at 13 does, and stops
    screen, *_ = _run(watch_from=2, abort_on="collapse", patience=4, window=11, steps=12, final_alpha=8.0)
    assert screen.verdict.collapse_risk and screen.stop is None
    assert screen.watch.streak[StopReason.COLLAPSE_RISK] == 3
    screen, *_ = _run(watch_from=2, abort_on="collapse", patience=4, window=11, final_alpha=8.0)
    assert screen.stop.step == 13 and [r["step"] for r in screen.watch.log] == [4, 7, 10, 13]


def test_default_start_is_the_warmups_end_when_given_else_the_windows_end():
    assert Settings(warmup_steps=5, window=WINDOW).watch_start == 5
    assert Settings(window=WINDOW).watch_start == WINDOW
    assert Settings(window=WINDOW, warmup_steps=50).watch_start == WINDOW  # a warm-up past the window: after it
    assert Settings(window=WINDOW, warmup_steps=5, watch_from=8).watch_start == 8  # given wins
    # no warm-up (0): a start at step 1 is unmeasured, so the watch stays after the window unless watch_from says
    assert Settings(window=WINDOW, warmup_steps=0).watch_start == WINDOW
    assert Settings(window=WINDOW, warmup_steps=0).watch_start_text == "after the window"
    assert Settings(window=WINDOW, warmup_steps=0, watch_from=1).watch_start == 1
    warm, *_ = _run(warmup_steps=5)
    assert [r["step"] for r in warm.watch.log] == _expected_checks(5, STEPS) == [7, 10, 13]
    late, *_ = _run(watch_from=40)  # at or after the window: today's behaviour
    assert [r["step"] for r in late.watch.log] == _expected_checks(WINDOW, STEPS)
    assert Settings(warmup_steps=5).watch_start_text == "from step 5 (the warm-up's end)"
    assert Settings(watch_from=7).watch_start_text == "from step 7"
    assert Settings(watch_from=700).watch_start_text == Settings().watch_start_text == "after the window"


def test_the_watch_measures_nothing_before_its_start_and_is_off_at_zero():
    screen = Screen(window=WINDOW, watch_every_n_steps=EVERY, watch_from=6, info=lambda line: None)
    model = Gated()
    screen.attach(model, example_input=torch.randn(2, 4))
    # attached from the window's first step (one hook layout under torch.compile), disabled until its start
    assert screen.watch.hooks.attached and not screen.watch.measuring
    batches = _batches()
    for i in range(6):  # steps 0 and 3 are multiples of 3 before the start: not measured
        screen.step(model(batches[i]).square().mean())
        assert screen.watch.log == [] and int(screen.watch.hooks.counter.total.sum()) == 0
    assert screen.watch.measuring  # steps done: 6, the first watched step's forwards come next
    off = Screen(window=WINDOW, watch_every_n_steps=0, watch_from=2, info=lambda line: None)
    off.attach(Gated(), example_input=torch.randn(2, 4))
    assert off.watch is None
    late = Screen(window=WINDOW, watch_every_n_steps=EVERY, info=lambda line: None)
    late.attach(Gated(), example_input=torch.randn(2, 4))
    assert not late.watch.hooks.attached  # the default without a warm-up: after the window, as before


def _saved(screen: Screen, model: nn.Module) -> dict:
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "satmon": screen.state_dict()}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_resume_mid_window_with_an_early_watch_keeps_watching_from_the_right_step():
    full, *_ = _run(watch_from=2)
    torch.manual_seed(0)
    model = Gated()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    options = {"window": WINDOW, "watch_every_n_steps": EVERY, "product": "exact", "watch_from": 2}
    first = Screen(info=lambda line: None, **options).attach(model, example_input=torch.randn(2, 4))
    _train(first, model, opt, range(5))  # 5 steps: one check (at 4) in the window
    saved, opt_state = _saved(first, model), copy.deepcopy(opt.state_dict())
    model = Gated()
    model.load_state_dict(saved["model"])
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    opt.load_state_dict(opt_state)
    second = Screen(info=lambda line: None, **options)
    second.load_state_dict(saved["satmon"])
    second.attach(model, step=5, example_input=torch.randn(2, 4))
    _train(second, model, opt, range(5, STEPS))
    assert [r["step"] for r in first.watch.log] == [4]
    assert [r["step"] for r in second.watch.log] == [7, 10, 13]  # the checks the uninterrupted run made after 5
    assert [r["gated_saturation"] for r in second.watch.log] == [r["gated_saturation"] for r in full.watch.log[1:]]
    assert second.verdict.saturation == full.verdict.saturation


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "100"])
def test_bad_watch_from_is_refused_with_the_expected_message(bad):
    with pytest.raises(ValueError, match=r"Expected `watch_from` to be a positive int .*, got "):
        Settings(watch_from=bad)
    with pytest.raises(ValueError, match="Expected `watch_from`"):
        Screen(watch_from=bad)


def test_the_lightning_callback_stops_in_the_window_at_the_first_check(tmp_path):
    monitor = SaturationMonitor(window=8, watch_every_n_steps=2, watch_from=2, abort_on="collapse", verbose=False)
    with pytest.warns(UserWarning, match="stopped training at step 3"):
        t = trainer(tmp_path, max_steps=20, callbacks=[monitor])
        t.fit(llama("swiglu"), token_loader(20))
    # step 2 (global_step 2 in its training_step) is watched, read when it ends: the trainer stops after step 3
    assert t.global_step == 3 and monitor.stop.step == 3 and monitor.stop.reason is StopReason.COLLAPSE_RISK
    assert [r["step"] for r in monitor.watch_log] == [3] and monitor.watch_log[0]["gated_saturation"] >= 0.5
    assert monitor.verdict.partial and monitor.verdict.window == 3  # the three steps counted, the stopped one too


def test_the_grids_watch_record_keeps_the_start_and_the_earliest_stop():
    from types import SimpleNamespace

    from satmon.grid.train import WatchLog

    log = WatchLog(checks=[{"step": 4, "flagged": True}, {"step": 13, "flagged": True}])
    risky, calm = SimpleNamespace(collapse_risk=True), SimpleNamespace(collapse_risk=False)
    early = log.record(Settings(window=WINDOW, watch_from=2), risky, WINDOW)
    assert (early["watch_from"], early["start"], early["first_flag_step"], early["would_stop_at"]) == (2, 2, 4, 4)
    late = WatchLog(checks=[{"step": 13, "flagged": True}]).record(Settings(window=WINDOW), risky, WINDOW)
    assert (late["watch_from"], late["start"], late["would_stop_at"]) == (None, WINDOW, WINDOW)  # as before
    assert WatchLog(checks=[]).record(Settings(window=WINDOW), calm, WINDOW)["would_stop_at"] is None


class _CountingBackend:
    """A Dynamo back end that counts compiled graphs and hands them to ``aot_eager`` (eager's kernels: same counts)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs += 1
        return lookup_backend("aot_eager")(gm, example_inputs)


def _compiled_run(**options) -> tuple[Screen, list[int]]:
    """The plain loop on a compiled model; returns the screen and the graphs compiled after each step."""
    torch.manual_seed(0)
    model, backend = Gated(), _CountingBackend()
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    screen = Screen(window=WINDOW, watch_every_n_steps=EVERY, product="exact", info=lambda line: None, **options)
    screen.attach(compiled, example_input=torch.randn(2, 4))
    graphs = []
    for x in _batches():
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        screen.step(loss)
        graphs.append(backend.graphs)
    return screen, graphs


def test_under_torch_compile_an_early_watch_reads_as_eager_and_adds_one_graph_in_the_window():
    dynamo = pytest.importorskip("torch._dynamo")
    try:  # the platform's support, probed on its own: a failure of satmon's below fails the test
        torch.compile(lambda x: x * 2, backend="aot_eager")(torch.ones(2))
    except Exception as exc:
        pytest.skip(f"torch.compile is unsupported here: {type(exc).__name__}: {exc}")
    dynamo.reset()
    try:
        early, early_graphs = _compiled_run(watch_from=2)
        dynamo.reset()
        default, default_graphs = _compiled_run()
    finally:
        dynamo.reset()
    eager, *_ = _run(watch_from=2)
    assert early.watch.log == eager.watch.log and early.verdict.saturation == eager.verdict.saturation
    # the watch's hooks flip between two states in the window: one graph more than the window alone, none per step
    assert early_graphs[WINDOW - 1] == default_graphs[WINDOW - 1] + 1
    assert early_graphs[-1] == early_graphs[WINDOW + 2] <= default_graphs[-1] + 1


def test_the_first_flag_is_said_once_where_the_verdict_goes_with_the_grids_remedy():
    """Whatever ``abort_on`` is (here "never"), the collapse watch's first flag of a run is said once: on the console,
    as the text ``satmon/collapse`` at its step, and as a note on the card, with what changed a flagged run's outcome in
    satmon's collapse grid (satmon.study.COLLAPSE_REMEDY)."""
    from satmon import study
    from satmon.io.tags import TAG

    torch.manual_seed(0)
    model, lines, sink = Gated(), [], RecordingSink()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    screen = Screen(
        info=lines.append,
        warn=lambda line: None,
        sink=sink,
        window=WINDOW,
        watch_every_n_steps=EVERY,
        product="exact",
        watch_from=2,
    )
    screen.attach(model, example_input=torch.randn(2, 4))
    _train(screen, model, opt, range(STEPS))
    flagged = [r["step"] for r in screen.watch.log if r.get(StopReason.COLLAPSE_RISK.value)]
    assert len(flagged) >= 2 and flagged[0] == 4  # the gated DyT saturates at every check: flagged at the first
    said = [line for line in lines if "collapse watch flagged" in line]
    assert said == [
        f"satmon: the collapse watch flagged step 4: saturation of DyT feeding gated MLPs "
        f"{screen.watch.log[0]['gated_saturation']:.4f} >= 0.5; what changed it: {study.COLLAPSE_REMEDY} "
        "(docs/science/abort_policy.md)."
    ]
    texts = [(c[1], c[3]) for c in sink.calls if c[0] == "text" and c[1] == TAG.collapse_text]
    assert texts == [(TAG.collapse_text, 4)]
    card = " ".join(screen.verdict.card().split())
    assert "Note: the collapse watch flagged step 4" in card and study.COLLAPSE_REMEDY in card


def test_a_resumed_run_does_not_say_its_first_flag_again():
    """The first flag is said once a run: a run resumed from a checkpoint written after it (the card's notes keep it)
    says no other, though the watch flags again at every check after the resume."""
    torch.manual_seed(0)
    model, lines = Gated(), []
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    options = {"window": WINDOW, "watch_every_n_steps": EVERY, "product": "exact", "watch_from": 2}
    first = Screen(info=lines.append, warn=lambda line: None, sink=RecordingSink(), **options)
    first.attach(model, example_input=torch.randn(2, 4))
    assert _train(first, model, opt, range(6)) == [1, 2, 3, 4, 5, 6]
    state = first.state_dict()
    assert state["collapse"] == {"flag_step": [4]}
    second = Screen(info=lines.append, warn=lambda line: None, sink=RecordingSink(), **options)
    second.load_state_dict(state)
    second.attach(model, example_input=torch.randn(2, 4), step=6)
    _train(second, model, opt, range(6, STEPS))
    assert [r["step"] for r in second.watch.log if r.get(StopReason.COLLAPSE_RISK.value)] == [7, 10, 13]
    said = [line.split(":")[1] for line in lines if "collapse watch flagged" in line]
    assert said == [" the collapse watch flagged step 4"]
    notes = [n for n in second.verdict.notes if n.startswith("the collapse watch flagged")]
    assert [n.split(":")[0] for n in notes] == ["the collapse watch flagged step 4"]


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("collapse", {"flag_step": []}),
        ("collapse", {"flag_step": ["x"]}),
        ("collapse", {"flag_step": [None]}),
        ("trap", {"streak": [2], "closed_step": [[1]], "named_step": [-1]}),
        ("trap", {"streak": []}),
    ],
)
def test_a_checkpoint_whose_watch_state_is_unreadable_is_resumed_with_a_warning(key, bad):
    """A saved watch state that is not what satmon saved (a hand-edited or damaged checkpoint) is named in a warning
    and ignored whole: the resumed run goes on, and the collapse watch says its first flag afresh."""
    torch.manual_seed(0)
    model = Gated()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    options = {"window": WINDOW, "watch_every_n_steps": EVERY, "product": "exact", "watch_from": 2}
    first = Screen(info=lambda line: None, warn=lambda line: None, sink=RecordingSink(), **options)
    first.attach(model, example_input=torch.randn(2, 4))
    _train(first, model, opt, range(6))
    lines, warnings = [], []
    second = Screen(info=lines.append, warn=warnings.append, sink=RecordingSink(), **options)
    second.load_state_dict({**first.state_dict(), key: bad})
    second.attach(model, example_input=torch.randn(2, 4), step=6)
    assert _train(second, model, opt, range(6, STEPS)) == list(range(7, STEPS + 1))
    named = [w for w in warnings if f"saved {key!r} state is not readable" in w]
    assert len(named) == 1 and "it is ignored" in named[0], warnings
    if key == "collapse":
        assert second.watch.flag_step == 7 and sum("collapse watch flagged step 7" in line for line in lines) == 1
    else:  # nothing of it was taken: the trap starts afresh
        assert second.trap.closed_step is None or second.trap.closed_step > 6
