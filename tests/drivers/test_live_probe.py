"""The live probe inside SaturationMonitor: trajectories at the expected global steps (read back
from TensorBoard), checkpoint-save probes, warnings, and no interference with the saturation counts."""

from __future__ import annotations

import struct
import warnings
from fractions import Fraction
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import LambdaCallback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder
from satmon import DyT, SaturationMonitor, Settings, find_dyt_layers
from satmon.drivers.live_probe import LiveProbe
from satmon.io.tags import TAG
from satmon.results.probe_report import EMBEDDING, ProbeReport, SigmaMinReading


def _scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _fit_layernorm(tmp_path, monitor: SaturationMonitor, n_batches: int = 6, **kw):
    torch.manual_seed(0)
    lit = tiny_lit(norm="layernorm")
    logger = TensorBoardLogger(str(tmp_path), name="tb", default_hp_metric=False)
    kw.setdefault("callbacks", [monitor])
    tr = trainer(tmp_path, logger=logger, max_steps=n_batches, log_every_n_steps=1, **kw)
    tr.fit(lit, token_loader(n_batches))
    return lit, tr, _scalars(logger.log_dir)


def test_callback_logs_dead_direction_trajectories_at_expected_steps(tmp_path):
    monitor = SaturationMonitor(probe_every_n_steps=2, calibration_batches=2)  # no DyT: the probe alone runs
    _, _, tb = _fit_layernorm(tmp_path, monitor)
    live = monitor.live_probe
    assert [s for s, _ in live.reports] == [0, 2, 4, 6]
    assert len(live.batches) == 2 and live.batches[0][0].shape == (4, 16)
    layers = ["model.blocks.0.ln_1", "model.blocks.0.ln_2", "model.blocks.1.ln_1", "model.blocks.1.ln_2", "model.ln_f"]
    for name in layers:
        for tag in (TAG.deadir_alignment(name), TAG.deadir_null_dim(name), TAG.deadir_null_projection(name)):
            assert [s for s, _ in tb[tag]] == [0, 2, 4, 6], tag
        values = [v for _, v in tb[TAG.deadir_alignment(name)]]
        ref = [r.layers[name].alignment for _, r in live.reports]
        assert values == pytest.approx(ref, rel=1e-6)  # TensorBoard stores float32
        assert min(values) > 0.9999 and [v for _, v in tb[TAG.deadir_null_dim(name)]] == [1.0] * 4
    for block in ("model.blocks.0", "model.blocks.1"):
        assert [s for s, _ in tb[TAG.sigma_min_ratio(block)]] == [0, 2, 4, 6]
    assert [s for s, _ in tb[TAG.sigma_min_min_ratio]] == [0, 2, 4, 6]
    assert [v for _, v in tb[TAG.sigma_min_min_ratio]] == pytest.approx(
        [r.sigma_min.min_ratio for _, r in live.reports], rel=1e-6
    )
    assert TAG.saturation not in tb  # no DyT, and the probe leaves saturation tags to the window
    # the calibration set is saved beside the logs, so a replay can use the very same batches
    saved = torch.load(live.saved_to, weights_only=True)
    assert len(saved) == 2 and all(torch.equal(a, b) for x, y in zip(saved, live.batches) for a, b in zip(x, y))


def test_probe_on_checkpoint_save_runs_once_per_step(tmp_path):
    monitor = SaturationMonitor(probe_every_n_steps=2, probe_on_checkpoint=True, calibration_batches=1)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3, save_top_k=-1)
    _, tr, tb = _fit_layernorm(tmp_path, monitor, enable_checkpointing=True, callbacks=[monitor, ckpt])
    steps = [s for s, _ in monitor.live_probe.reports]
    assert steps == [0, 2, 3, 4, 6]  # step 6: both the schedule and a save, probed once
    assert [s for s, _ in tb[TAG.deadir_alignment("model.ln_f")]] == steps
    tr.save_checkpoint(str(tmp_path / "manual.ckpt"))  # same step again: no second probe
    assert len(monitor.live_probe.reports) == 5
    only_ckpt = SaturationMonitor(probe_on_checkpoint=True, calibration_batches=1)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt2"), every_n_train_steps=3, save_top_k=-1)
    _fit_layernorm(tmp_path / "b", only_ckpt, enable_checkpointing=True, callbacks=[only_ckpt, ckpt])
    assert [s for s, _ in only_ckpt.live_probe.reports] == [3, 6]


def test_probe_forwards_are_not_counted_by_the_window_and_run_after_it(tmp_path):
    torch.manual_seed(0)
    lit = tiny_lit(alpha_init=50.0)
    rec = InputRecorder(lit, [l.name for l in find_dyt_layers(lit)])  # training-mode forwards only
    monitor = SaturationMonitor(window=4, probe_every_n_steps=1, calibration_batches=2, verbose=False)
    tr = trainer(tmp_path, callbacks=[monitor], max_steps=7)
    tr.fit(lit, token_loader(7))
    ref = rec.counts(first=4)
    assert monitor.screen.hooks.counter.saturated.tolist() == [ref[n][0] for n in monitor.layer_names]
    assert monitor.screen.hooks.counter.total.tolist() == [ref[n][1] for n in monitor.layer_names]
    assert [s for s, _ in monitor.live_probe.reports] == list(range(8))  # 0..7, window over at 4
    report = monitor.live_probe.reports[-1][1]
    assert report.norm_type == "dyt" and report.saturation is not None
    assert not monitor.screen.hooks.attached
    assert all(not m._forward_pre_hooks for m in lit.modules())


def test_calibration_capture_leaves_the_training_data_order_alone(tmp_path):
    def batches_seen(probe_on: bool) -> list[Tensor]:
        torch.manual_seed(0)
        lit = tiny_lit(norm="layernorm")
        seen: list[Tensor] = []
        recorder = LambdaCallback(on_train_batch_start=lambda tr, pl_module, batch, i: seen.append(batch[0].clone()))
        x = torch.randint(0, 256, (32, 17), generator=torch.Generator().manual_seed(0))
        loader = DataLoader(TensorDataset(x[:, :-1], x[:, 1:]), batch_size=4, shuffle=True)
        kw = dict(probe_every_n_steps=2, calibration_batches=3) if probe_on else {}
        trainer(tmp_path, callbacks=[SaturationMonitor(on_missing="warn", **kw), recorder], max_steps=5).fit(
            lit, loader
        )
        return seen

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, probed = batches_seen(False), batches_seen(True)
    assert len(plain) == 5 and all(torch.equal(a, b) for a, b in zip(plain, probed))


# ------------------------------------------------------------------------------------ warnings
class AntiBlock(nn.Module):
    """A block whose update anti-aligns with the stream: f(x) = -0.9 x."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x: Tensor) -> Tensor:
        return x - 0.9 * x + 0.0 * self.ln(x)


class MeanlessLayerNorm(nn.Module):
    """A LayerNorm whose float32 path drops the mean subtraction (a kernel bug): satmon reads it as a LayerNorm
    (its float64 copy subtracts the mean), and in training it has lost the LayerNorm kernel."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float64:
            x = x - x.mean(-1, keepdim=True)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class TinyLM(pl.LightningModule):
    def __init__(self, blocks: nn.Module, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(256, d)
        self.blocks = blocks
        self.head = nn.Linear(d, 256)

    def forward(self, idx: Tensor) -> Tensor:
        return self.head(self.blocks(self.emb(idx)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x).reshape(-1, 256), y.reshape(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _warnings_of(tmp_path, lm: pl.LightningModule, match: str, steps: int = 3) -> tuple[SaturationMonitor, list[str]]:
    monitor = SaturationMonitor(probe_every_n_steps=1, calibration_batches=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, callbacks=[monitor], max_steps=steps).fit(lm, token_loader(steps))
    return monitor, [str(w.message) for w in caught if match in str(w.message)]


def test_anti_aligned_block_warns_once_from_step_one(tmp_path):
    torch.manual_seed(0)
    monitor, found = _warnings_of(tmp_path, TinyLM(nn.Sequential(AntiBlock(16), AntiBlock(16))), "sigma_min ratio")
    ratios = [r.sigma_min.min_ratio for _, r in monitor.live_probe.reports]
    assert len(ratios) == 4 and all(r == pytest.approx(0.01, rel=1e-5) for r in ratios)
    assert len(found) == 1, found
    assert (
        "at step 1" in found[0]
        and "more than 2x" in found[0]
        and "'blocks.1'" in found[0]
        and "blocks.0, blocks.1" in found[0]
    )


def test_lost_layernorm_kernel_warns_once_naming_the_layer(tmp_path):
    torch.manual_seed(0)
    lm = TinyLM(nn.Sequential(MeanlessLayerNorm(16), nn.Linear(16, 16)))  # no residual blocks: alignment only
    monitor, found = _warnings_of(tmp_path, lm, "dead-direction alignment", steps=2)
    assert len(found) == 1 and "'blocks.0'" in found[0] and "at step 0" in found[0]
    assert monitor.live_probe.reports[0][1].layers["blocks.0"].kind == "layernorm"


def test_no_warning_on_a_healthy_trained_layernorm_gpt(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit_layernorm(tmp_path, SaturationMonitor(probe_every_n_steps=3, calibration_batches=2))
    assert not [
        w for w in caught if "dead-direction alignment" in str(w.message) or "sigma_min ratio" in str(w.message)
    ]


def test_sigma_min_warning_when_the_invariance_held_then_broke(monkeypatch):
    import satmon.drivers.live_probe as live_probe_module

    def report(*ratios: float) -> ProbeReport:
        blocks = [EMBEDDING, *(f"b{i}" for i in range(len(ratios)))]
        k = min(range(len(ratios)), key=ratios.__getitem__)
        sigma = SigmaMinReading(blocks, [1.0] * len(blocks), [1.0, *ratios], True, "", ratios[k], blocks[k + 1])
        return ProbeReport(layers={}, sigma_min=sigma, norm_type="undetermined")

    queue = [report(0.8, 0.9), report(0.8, 0.9), report(1.1, 1.2), report(1.05, 0.95), report(0.9, 0.3)]
    monkeypatch.setattr(live_probe_module, "probe", lambda *a, **k: queue.pop(0))
    live = LiveProbe(every_n_steps=1)
    live.batches = [torch.zeros(1)]
    fake_trainer = SimpleNamespace(is_global_zero=True, loggers=[], global_step=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(5):
            fake_trainer.global_step = step
            live.maybe_run(fake_trainer, None)
            live.maybe_run(fake_trainer, None)  # once per step
    found = [str(w.message) for w in caught if "sigma_min ratio" in str(w.message)]
    assert [s for s, _ in live.reports] == [0, 1, 2, 3, 4]
    assert len(found) == 1 and "at step 3" in found[0] and "after it held" in found[0] and "'b1'" in found[0], found


# ------------------------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(probe_every_n_steps=0), "Expected `probe_every_n_steps` to be a positive int"),
        (dict(probe_every_n_steps=2.5), "Expected `probe_every_n_steps`"),
        (dict(probe_on_checkpoint="yes"), "Expected `probe_on_checkpoint` to be True or False"),
        (dict(probe_every_n_steps=5, calibration_batches=0), "Expected `calibration_batches` to be a positive int"),
        (dict(probe_every_n_steps=5, probe_forward_fn="x[0]"), "Expected `probe_forward_fn` to be a callable"),
    ],
)
def test_bad_probe_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SaturationMonitor(**kwargs)


def test_no_probe_by_default_and_a_dyt_free_model_raises_only_without_a_probe():
    assert SaturationMonitor().live_probe is None
    assert isinstance(SaturationMonitor(probe_on_checkpoint=True).live_probe, LiveProbe)
    lit = tiny_lit(norm="layernorm")
    with pytest.raises(ValueError, match="no DyT layer"):
        SaturationMonitor(on_missing="raise").setup(None, lit, "fit")
    with pytest.warns(UserWarning, match="no DyT layer"):  # the probe has LayerNorms to read: no error
        SaturationMonitor(on_missing="raise", probe_on_checkpoint=True).setup(None, lit, "fit")


# ------------------------------------------------------------------------- the monitor's settings, whole
ALPHA = 3.0
EDGE = struct.unpack("<f", struct.pack("<f", 2.0 / 3.0))[0]  # float32(2/3) = 0.6666666865...: 3 * EDGE is just above 2


def _f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


class Edge(pl.LightningModule):
    """One DyT (alpha 3, float32) over inputs at the rounding edge of the level: the exact product 3 * EDGE is
    2.00000006 > 2 (saturated), the float32 product the layer computes rounds to 2.0 (not saturated)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = DyT(8, alpha_init=ALPHA)
        self.head = nn.Linear(8, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.norm(x))

    def training_step(self, batch, batch_idx):
        return self(batch[0]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)  # alpha stays 3


def _edge_data() -> torch.Tensor:
    row = [EDGE, -EDGE, EDGE, 1.0, -0.9, 0.1, 0.5, -EDGE]  # 4 at the edge, 2 clearly saturated, 2 clearly not
    return torch.tensor([row] * 6, dtype=torch.float32)


def _edge_counts(x: torch.Tensor) -> tuple[int, int]:
    """Independent re-counts: the exact product in rationals, and the product rounded to float32 (one rounding of the
    exact product, which a double holds exactly for two float32 factors)."""
    values = [float(v) for v in x.flatten()]
    exact = sum(abs(Fraction(ALPHA) * Fraction(v)) > 2 for v in values)
    module = sum(abs(_f32(ALPHA * v)) > 2 for v in values)
    return exact, module


@pytest.mark.parametrize("product", ["exact", "module"])
def test_live_probe_counts_with_the_monitors_product(tmp_path, product):
    x = _edge_data()
    exact, module = _edge_counts(x)
    assert (exact, module) == (36, 12)  # the data does separate the two rules
    monitor = SaturationMonitor(
        window=2, product=product, probe_every_n_steps=1, calibration_batches=2, watch_every_n_steps=0, verbose=False
    )
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(Edge(), DataLoader(TensorDataset(x), batch_size=3))
    assert monitor.live_probe.settings is monitor.settings
    want = (exact if product == "exact" else module) / x.numel()
    for step, report in monitor.live_probe.reports:  # 0.2's live probe counted the module product whatever was set
        assert report.verdict.elements == x.numel() and report.verdict.saturation == want, (step, product)
    assert monitor.verdict.saturation == want  # the window, on the same data, counts with the same rule


def test_live_probe_verdict_shows_the_calibrations_caveat(tmp_path):
    from satmon.calibrate.fit import Cell, calibrate, write_calibration

    rows = [
        (0.30, False, "a"),
        (0.44, False, "a"),
        (0.46, True, "a"),
        (0.60, True, "b"),
        (0.35, False, "b"),
        (0.70, True, "b"),
    ]
    cal = write_calibration(
        calibrate([Cell(f"c{i}", g, h, {"saturation": s}) for i, (s, h, g) in enumerate(rows)], source="six runs"),
        tmp_path / "calibration.json",
    )
    monitor = SaturationMonitor(
        calibration=str(tmp_path / "calibration.json"), probe_every_n_steps=1, calibration_batches=1, verbose=False
    )
    trainer(tmp_path, max_steps=1, callbacks=[monitor]).fit(
        Edge(), DataLoader(TensorDataset(_edge_data()), batch_size=3)
    )
    for _, report in monitor.live_probe.reports:  # 0.2's live probe showed the study's caveat and compared with 0.43
        v = report.verdict
        assert v.threshold == cal.threshold and v.rule.caveat == cal.caveat()
        card = v.card()
        assert "satmon calibrate" in card and "6 cells in 2 groups (six runs)" in card and "12 cells" not in card


def test_live_probe_by_hand_takes_settings_or_fields_and_checks_probe_arguments():
    s = Settings(product="exact", level=1.5)
    assert LiveProbe(every_n_steps=1, settings=s).settings is s
    assert LiveProbe(every_n_steps=1, level=1.5).settings.level == 1.5  # fields build the Settings
    with pytest.raises(ValueError, match="got both"):
        LiveProbe(every_n_steps=1, settings=s, level=2.5)
    with pytest.raises(TypeError, match=r"Expected probe arguments among .*'max_dim'.*got \['max_dims'\]"):
        LiveProbe(every_n_steps=1, max_dims=10)
    with pytest.raises(TypeError, match=r"Expected no \['step'\] among the probe arguments"):
        LiveProbe(every_n_steps=1, step=3)
    with pytest.raises(ValueError, match="Expected `max_dim` to be a positive int"):
        LiveProbe(every_n_steps=1, max_dim=0)  # at construction, not at the first probe
