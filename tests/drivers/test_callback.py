"""SaturationMonitor's live counts against an independent float64 re-computation.

The reference (``helpers.InputRecorder``) records every DyT input of training forwards in float64
and counts ``|alpha * x| > level`` itself. Counts are integers, so they must agree exactly.
``alpha_init=50`` puts the tiny model's pooled saturation near 0.25 (at alpha 2.0 the freshly
initialised GPT saturates nothing, which would make every comparison vacuous).
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder, counts_of
from satmon import SaturationMonitor, find_dyt_layers
from satmon.observe.saturation import SaturationHooks

ALPHA = 50.0


def _fit(tmp_path, monitor: SaturationMonitor, n_batches: int = 12, seed: int = 0, val: bool = False, **trainer_kw):
    """Train a tiny DyT GPT with ``monitor`` and the float64 recorder attached; return (lit, recorder)."""
    torch.manual_seed(seed)
    lit = tiny_lit(alpha_init=ALPHA)
    names = [l.name for l in find_dyt_layers(lit)]
    rec = InputRecorder(lit, names)
    kw = dict(callbacks=[monitor, *trainer_kw.pop("callbacks", [])])
    kw.update(trainer_kw)
    tr = trainer(tmp_path, **kw)
    tr.fit(lit, token_loader(n_batches), val_dataloaders=token_loader(3, seed=1) if val else None)
    return lit, rec, tr


def _reference(rec: InputRecorder, forwards, level: float = 2.0) -> dict[str, tuple[int, int]]:
    """Float64 (saturated, total) per layer over the training forwards with these indices."""
    out = {}
    for name, items in rec.inputs.items():
        out[name] = counts_of([items[i] for i in forwards], level)
    return out


def _assert_counts_equal(monitor: SaturationMonitor, ref: dict[str, tuple[int, int]]) -> None:
    assert monitor.layer_names == list(ref)
    sat = monitor.screen.hooks.counter.saturated.tolist()
    total = monitor.screen.hooks.counter.total.tolist()
    assert sat == [ref[n][0] for n in monitor.layer_names]
    assert total == [ref[n][1] for n in monitor.layer_names]
    assert monitor.screen.hooks.counter.nonfinite.tolist() == [0] * len(ref)
    v = monitor.verdict
    assert v is not None
    assert v.per_layer == {n: s / t for n, (s, t) in ref.items()}
    ref_sat, ref_total = sum(s for s, _ in ref.values()), sum(t for _, t in ref.values())
    assert v.saturation == ref_sat / ref_total
    assert v.elements == ref_total
    assert 0.05 < v.saturation < 0.95, "the test model should saturate some but not all elements"


class _EvalForwards(Callback):
    """Counts DyT forwards in eval mode (validation and the sanity check) to prove they happened."""

    def __init__(self) -> None:
        self.eval_forwards = 0
        self.sanity_batches = 0

    def on_fit_start(self, trainer, pl_module):
        layer = find_dyt_layers(pl_module)[0].module
        layer.register_forward_hook(
            lambda m, a, o: setattr(self, "eval_forwards", self.eval_forwards + (not m.training))
        )

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.sanity_batches += trainer.sanity_checking


def test_counts_equal_float64_reference_and_skip_validation(tmp_path):
    window = 8
    monitor = SaturationMonitor(window=window, verbose=False)
    probe = _EvalForwards()
    # Sanity check (2 batches) before training, validation after steps 3 and 6 (inside the window) and 9.
    _, rec, tr = _fit(
        tmp_path,
        monitor,
        n_batches=12,
        val=True,
        callbacks=[probe],
        max_steps=10,
        num_sanity_val_steps=2,
        limit_val_batches=2,
        val_check_interval=3,
    )
    assert probe.sanity_batches == 2
    # validation really ran, inside the window too; plus satmon's one gating trace (eval, no grad) of the first batch
    assert probe.eval_forwards == 2 + 3 * 2 + 1
    assert len(next(iter(rec.inputs.values()))) == 10  # training forwards (the reference keeps all of them)
    assert monitor.screen.hooks.queue.keep_inputs  # CPU: counted after each forward, from the kept inputs
    _assert_counts_equal(monitor, _reference(rec, range(window)))
    assert monitor.verdict.step == window and monitor.verdict.window == window and monitor.steps_seen == window
    assert monitor.verdict.decision == ("go" if monitor.verdict.saturation >= 0.43 else "no-go")
    assert monitor.verdict.margin == pytest.approx(monitor.verdict.saturation - 0.43, abs=0, rel=1e-12)


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    window = 5
    monitor = SaturationMonitor(window=window, verbose=False)
    _, rec, tr = _fit(tmp_path, monitor, n_batches=16, accumulate_grad_batches=2, max_steps=7)
    assert tr.global_step == 7
    assert monitor.verdict.step == window and monitor.steps_seen == window
    ref = _reference(rec, range(2 * window))  # two micro-batches per optimizer step
    _assert_counts_equal(monitor, ref)
    per_forward = 4 * 16 * 32  # (B, T, C)
    assert monitor.screen.hooks.counter.total.tolist() == [2 * window * per_forward] * len(ref)


def satmon_hooks(module: torch.nn.Module) -> list[tuple[object, SaturationHooks]]:
    """The satmon hooks on ``module``: ``(hook, the SaturationHooks object that registered it)``."""
    found = []
    for fn in [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]:
        owners = [
            c.cell_contents
            for c in (getattr(fn, "__closure__", None) or ())
            if isinstance(c.cell_contents, SaturationHooks)
        ]
        found += [(fn, o) for o in owners]
    return found


def _no_watch() -> dict:
    """Turn off the post-window watch where the monitor has one (it keeps its own, disabled hooks)."""
    return {"watch_every_n_steps": 0}


class _HooksDuringWindow(Callback):
    def __init__(self) -> None:
        self.seen: list[list[object]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 1:
            self.seen = [[o for _, o in satmon_hooks(l.module)] for l in find_dyt_layers(pl_module)]


def _assert_window_over(lit, monitor: SaturationMonitor) -> None:
    """The window's hooks are gone, any other satmon hook left is switched off, and forwards count nothing."""
    assert monitor.screen.hooks.attached is False
    for layer in find_dyt_layers(lit):
        owners = [o for _, o in satmon_hooks(layer.module)]
        assert monitor.screen.hooks not in owners, layer.name
        assert all(o.enabled is False for o in owners), layer.name
    before = [
        t.clone()
        for t in (
            monitor.screen.hooks.counter.saturated,
            monitor.screen.hooks.counter.total,
            monitor.screen.hooks.counter.nonfinite,
        )
    ]
    x = torch.randint(0, 256, (2, 16))
    for mode in (True, False):
        lit.train(mode)
        with torch.no_grad():
            lit(x)
    after = (
        monitor.screen.hooks.counter.saturated,
        monitor.screen.hooks.counter.total,
        monitor.screen.hooks.counter.nonfinite,
    )
    assert all(torch.equal(b, a) for b, a in zip(before, after))


@pytest.mark.parametrize("watch", [False, True], ids=["no-watch", "default"])
def test_hooks_removed_after_window(tmp_path, watch):
    window = 4
    monitor = SaturationMonitor(window=window, verbose=False, **({} if watch else _no_watch()))
    during = _HooksDuringWindow()
    lit, rec, tr = _fit(tmp_path, monitor, n_batches=8, callbacks=[during], max_steps=7)
    layers = find_dyt_layers(lit)
    assert during.seen == [[monitor.screen.hooks]] * len(layers)  # the detection does see satmon's hooks in the window
    _assert_counts_equal(monitor, _reference(rec, range(window)))  # steps 4..6 were not counted
    _assert_window_over(lit, monitor)
    if not watch:
        for layer in layers:  # nothing of satmon's is left: only the reference recorder's hook
            assert satmon_hooks(layer.module) == [], layer.name
            assert len(layer.module._forward_hooks) == 1 and not layer.module._forward_pre_hooks


@pytest.mark.parametrize("accumulate", [1, 2])
def test_sample_every_counts_only_sampled_steps(tmp_path, accumulate):
    window = 8
    monitor = SaturationMonitor(window=window, sample_every=2, verbose=False)
    _, rec, tr = _fit(tmp_path, monitor, n_batches=8 * accumulate, accumulate_grad_batches=accumulate, max_steps=window)
    steps = [s for s in range(window) if s % 2 == 0]  # optimizer steps 0, 2, 4, 6
    forwards = [s * accumulate + m for s in steps for m in range(accumulate)]
    _assert_counts_equal(monitor, _reference(rec, forwards))
    assert monitor.verdict.step == window


# ------------------------------------------------------------------------------- refused at construction
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"calibration": 123},
            r"Expected a path to a calibration.json or a Calibration, got 123 \(int\) for `calibration`: "
            r"pass the file `satmon calibrate` wrote",
        ),
        ({"calibration": ["cal.json"]}, r"Expected a path to a calibration.json or a Calibration, got <list> \(list\)"),
        (
            {"gating_mapping": {"a": 1}},
            r"Expected `gating_mapping\['a'\]` to be the name of the gated MLP module it feeds "
            r"\(str\) or None \(it feeds none\), got 1 \(int\): e.g.",
        ),
        (
            {"gating_mapping": {("a",): "mlp"}},
            r"Expected the keys of `gating_mapping` to be DyT layer names \(str\), got "
            r"<tuple> \(tuple\): name the layer as model.named_modules\(\) does",
        ),
        (
            {"gating_forward_fn": "x"},
            r"Expected `gating_forward_fn` to be a callable \(model, batch\) -> Any or None, got "
            r"'x' \(str\): pass a function, e.g. gating_forward_fn=lambda model, batch:",
        ),
        (
            {"probe_every_n_steps": 5, "probe_forward_fn": 3},
            r"Expected `probe_forward_fn` to be a callable \(model, batch\) "
            r"-> Any or None, got 3 \(int\): pass a function",
        ),
        ({"probe_forward_fn": 3}, r"Expected `probe_forward_fn` to be a callable"),  # checked with the probe off too
        ({"log_every_n_steps": 0}, "Expected `log_every_n_steps` to be a positive int or None"),
    ],
)
def test_bad_arguments_are_refused_at_construction_saying_what_to_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SaturationMonitor(**kwargs)


def test_an_unreadable_calibration_is_refused_at_construction(tmp_path):
    binary = tmp_path / "calibration.json"
    binary.write_bytes(bytes(range(256)))  # 0.2: UnicodeDecodeError from deep inside json
    with pytest.raises(
        ValueError,
        match=r"Expected a calibration JSON \(UTF-8 text\) written by `satmon calibrate` at "
        r".*calibration.json', got a binary file \(byte 0x80 at offset 128",
    ):
        SaturationMonitor(calibration=binary)
    with pytest.raises(ValueError, match="got a folder at"):
        SaturationMonitor(calibration=tmp_path)


def test_unknown_options_and_settings_together_are_refused():
    from satmon import Settings

    with pytest.raises(
        TypeError,
        match=r"Expected SaturationMonitor options among \[.*'watch_every_n_steps', 'watch_from', 'window'\] "
        r"\(plus sink, log_every_n_steps, on_missing, verbose, .*gating_forward_fn\), got "
        r"\['windw'\]: check the spelling",
    ):
        SaturationMonitor(windw=3)
    with pytest.raises(
        ValueError, match=r"Expected either `settings` or keyword options, got both \(options \['window'\]\)"
    ):
        SaturationMonitor(settings=Settings(), window=3)
    shared = Settings(window=3, sample_every=3)
    monitor = SaturationMonitor(settings=shared, verbose=False)
    assert (
        monitor.settings is shared
        and monitor.screen.settings is shared
        and (monitor.settings.window, monitor.settings.sample_every) == (3, 3)
    )
    with pytest.raises(AttributeError, match="has no attribute 'windw'"):
        _ = monitor.windw
