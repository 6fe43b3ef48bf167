"""Collapse risk of DyT feeding SwiGLU gates, the post-window watch and the abort policy."""

import math

import pytest

from helpers import token_loader, trainer
from satmon import SatmonAbort, SaturationMonitor, StopReason, study
from satmon.demos.lit import LitLM


def llama(mlp="swiglu", alpha=200.0, lr=0.0, **kw):
    return LitLM(
        arch="llama",
        d_model=32,
        n_layers=2,
        n_heads=2,
        seq_len=16,
        norm="dyt",
        mlp=mlp,
        alpha_init=alpha,
        lr=lr,
        warmup=1,
        **kw,
    )


def test_gated_model_above_collapse_threshold_is_no_go_with_collapse_risk(tmp_path):
    monitor = SaturationMonitor(window=3, verbose=False, watch_every_n_steps=0)
    trainer(tmp_path, max_steps=3, callbacks=[monitor]).fit(llama("swiglu"), token_loader(3))
    v = monitor.verdict
    assert v.saturation >= 0.5 and v.gated is True and v.collapse_risk is True
    assert v.decision == "no-go" and v.reason.startswith("collapse risk")
    # names as discovered on the LightningModule
    assert v.gated_layers == (
        "model.blocks.0.mlp_norm",
        "model.blocks.1.mlp_norm",
    )
    # a risk reading per gated block: the feeding DyT's saturation and the gate statistics
    assert len(v.risk) == 2
    for block, r in v.risk.items():
        norm = block.replace(".mlp", ".mlp_norm")
        assert r["dyt_saturation"] == pytest.approx(v.per_layer[norm])
        assert 0.0 <= r["flat_fraction"] <= 1.0 and r["mean_abs_hidden"] > 0
    assert "Gated MLP after DyT: yes" in v.card() and "collapse risk: YES" in v.card()
    # the measured record and the grid's remedy stand beside the flag (satmon.study; docs/science/abort_policy.md)
    card = " ".join(v.card().split())
    assert f"Collapse record: {study.COLLAPSE_RECORD}" in card and f"What changed it: {study.COLLAPSE_REMEDY}" in card


def test_same_model_without_gate_follows_the_043_rule(tmp_path):
    monitor = SaturationMonitor(window=3, verbose=False, watch_every_n_steps=0)
    trainer(tmp_path, max_steps=3, callbacks=[monitor]).fit(llama("gelu"), token_loader(3))
    v = monitor.verdict
    assert v.saturation >= 0.5 and v.gated is False and v.collapse_risk is False
    assert v.decision == "go" and "Gated MLP after DyT: no" in v.card()
    assert "Collapse record" not in v.card()  # no gate, no collapse record


def test_graceful_abort_stops_at_the_verdict_step_with_reason(tmp_path):
    monitor = SaturationMonitor(window=4, abort_on="collapse", verbose=False)
    with pytest.warns(UserWarning, match="stopped training at step 4"):
        t = trainer(tmp_path, max_steps=20, callbacks=[monitor])
        t.fit(llama("swiglu"), token_loader(20))
    assert t.global_step == 4 and monitor.stop.reason is StopReason.COLLAPSE_RISK and not monitor.stop.dry_run


def test_raise_mode_raises_the_dedicated_exception(tmp_path):
    monitor = SaturationMonitor(window=2, abort_on="collapse", abort_mode="raise", verbose=False)
    with pytest.raises(SatmonAbort, match="collapse-risk") as info:
        trainer(tmp_path, max_steps=20, callbacks=[monitor]).fit(llama("swiglu"), token_loader(20))
    assert info.value.reason is StopReason.COLLAPSE_RISK and info.value.step == 2


def test_dry_run_neither_stops_nor_raises_but_logs(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path, name="tb")
    monitor = SaturationMonitor(window=2, abort_on="collapse", abort_mode="raise", dry_run=True, verbose=False)
    t = trainer(tmp_path, max_steps=6, callbacks=[monitor], logger=logger)
    t.fit(llama("swiglu"), token_loader(6))
    assert t.global_step == 6 and monitor.stop.dry_run and monitor.stop.reason is StopReason.COLLAPSE_RISK
    ea = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "scalars": 0}).Reload()
    text = ea.Tensors("satmon/stop")[0]
    assert text.step == 2 and b"would stop" in text.tensor_proto.string_val[0]


class LossBomb(LitLM):
    """Returns a non-finite (or a huge) loss from step `at` on."""

    def __init__(self, at=7, kind="nan", **kw):
        super().__init__(**kw)
        self.at, self.kind = at, kind

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.global_step >= self.at:
            return loss * (float("nan") if self.kind == "nan" else 50.0)
        return loss


@pytest.mark.parametrize("abort_on", ["any", "collapse"])
def test_nonfinite_loss_triggers_the_any_breach_policy_only(tmp_path, abort_on):
    model = LossBomb(
        at=7, arch="gpt", d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=200.0, lr=1e-3, warmup=1
    )
    monitor = SaturationMonitor(window=2, abort_on=abort_on, watch_every_n_steps=3, verbose=False)
    t = trainer(tmp_path, max_steps=14, callbacks=[monitor])
    t.fit(model, token_loader(14))
    if abort_on == "any":
        # NaN loss in optimizer step 7 -> the per-step guard stops at its end (0.1 waited for watched step 9: step 10)
        assert monitor.stop.reason is StopReason.NONFINITE and t.global_step == 8 and monitor.stop.step == 8
    else:
        assert monitor.stop is None and t.global_step == 14


class ActivationBomb(LitLM):
    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_step == 6:
            self.model.blocks[1].ln_1.register_forward_pre_hook(
                lambda m, a: (a[0].masked_fill(a[0] > 0, float("inf")),)
            )
        return super().training_step(batch, batch_idx)


def test_nonfinite_activation_mid_run_triggers_any(tmp_path):
    model = ActivationBomb(
        arch="gpt", d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=200.0, lr=1e-3, warmup=1
    )
    monitor = SaturationMonitor(window=2, abort_on="any", watch_every_n_steps=2, verbose=False)
    t = trainer(tmp_path, max_steps=20, callbacks=[monitor])
    t.fit(model, token_loader(20))
    assert monitor.stop.reason is StopReason.NONFINITE and monitor.stop.step == 7
    assert monitor.watch_log[-1]["nonfinite"] > 0 and monitor.watch_log[0]["nonfinite"] == 0


def test_loss_spike_with_patience(tmp_path):
    model = LossBomb(
        at=30,
        kind="spike",
        arch="gpt",
        d_model=32,
        n_layers=2,
        n_heads=2,
        seq_len=16,
        alpha_init=200.0,
        lr=1e-4,
        warmup=1,
    )
    monitor = SaturationMonitor(
        window=2, abort_on="any", watch_every_n_steps=4, patience=2, loss_baseline=20, verbose=False
    )
    t = trainer(tmp_path, max_steps=60, callbacks=[monitor])
    t.fit(model, token_loader(60))
    # spike from step 30: checks at the ends of steps 32 and 36 breach; patience 2 stops at the second
    assert monitor.stop.reason is StopReason.LOSS_SPIKE and monitor.stop.step == 37
    spikes = [r for r in monitor.watch_log if r["loss-spike"]]
    assert [r["step"] for r in spikes] == [33, 37] and all(
        not r["loss-spike"] for r in monitor.watch_log if r["step"] < 33
    )


def test_state_round_trip_keeps_the_stop_reason(tmp_path):
    monitor = SaturationMonitor(window=2, abort_on="collapse", verbose=False)
    with pytest.warns(UserWarning):
        trainer(tmp_path, max_steps=10, callbacks=[monitor]).fit(llama("swiglu"), token_loader(10))
    state = monitor.state_dict()
    fresh = SaturationMonitor(window=2, abort_on="collapse")
    fresh.load_state_dict(state)
    assert (
        fresh.stop.reason is StopReason.COLLAPSE_RISK
        and fresh.stop.step == 2
        and fresh.stop.message == monitor.stop.message
    )
    assert fresh.verdict.collapse_risk and fresh.verdict.to_dict() == monitor.verdict.to_dict()


def test_watch_keeps_hooks_disabled_between_checks(tmp_path):
    monitor = SaturationMonitor(window=2, watch_every_n_steps=5, verbose=False)
    trainer(tmp_path, max_steps=12, callbacks=[monitor]).fit(llama("swiglu", lr=1e-3), token_loader(12))
    assert [r["step"] for r in monitor.watch_log] == [6, 11]  # steps 5 and 10 watched, read when they end
    assert not monitor.screen.hooks.attached and monitor.screen.watch.hooks.enabled is False
    assert int(monitor.screen.watch.hooks.counter.total.sum()) == 0  # read and reset at each check
    assert all(math.isfinite(r["gated_saturation"]) for r in monitor.watch_log)


def test_bad_policy_arguments():
    for kwargs, match in [
        ({"patience": 0}, "patience"),
        ({"collapse_threshold": 1.5}, "collapse_threshold"),
        ({"watch_every_n_steps": -1}, "watch_every_n_steps"),
        ({"loss_spike_z": 0}, "loss_spike_z"),
    ]:
        with pytest.raises(ValueError, match=f"Expected `{match}`"):
            SaturationMonitor(**kwargs)


def test_a_watch_check_returns_one_frozen_reading_with_its_due_breaches():
    """CollapseWatch on its own: a DyT whose every input saturates feeds 'gated' layer 0; patience 2."""
    import dataclasses

    import torch

    from satmon import DyT, find_dyt_layers
    from satmon.observe.counters import SaturationCounter
    from satmon.observe.saturation import SaturationHooks
    from satmon.screen.watch import CollapseWatch, LossHistory, WatchReading

    model = torch.nn.Sequential(DyT(4, alpha_init=100.0), torch.nn.Linear(4, 4))
    layers = find_dyt_layers(model)
    losses = LossHistory(20)
    watch = CollapseWatch(SaturationHooks(layers, SaturationCounter(1)), [0], None, {}, 1, 0.5, 8.0, 2, losses)
    watch.start()
    readings = []
    for step in (1, 2):
        watch.select(step)
        model(torch.ones(3, 4))  # |100 * 1| > 2: every element saturates
        losses.push(torch.tensor(1.0))
        readings.append(watch.check(step, lambda t: t))
    first, second = readings
    assert isinstance(first, WatchReading) and first.gated_saturation == 1.0 and first.nonfinite == 0
    assert first.found == {StopReason.COLLAPSE_RISK: True, StopReason.NONFINITE: False, StopReason.LOSS_SPIKE: False}
    assert first.due == ()  # patience 2: one breach is not due yet
    assert [r for r, _ in second.due] == [StopReason.COLLAPSE_RISK]
    assert second.due[0][1] == "saturation of DyT feeding gated MLPs 1.0000 >= 0.5 for 2 consecutive checks"
    with pytest.raises(dataclasses.FrozenInstanceError):
        second.due = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        second.found[StopReason.NONFINITE] = True  # type: ignore[index]
    assert watch.log == [first.to_dict(), second.to_dict()]
