"""A monitor's lifetime under the faults of round 4 (issue 30): a second ``fit``, a new Trainer or model, two
monitors in one Trainer, and resumes whose layer set changed or whose window is already over.

Every count is checked against an independent float64 recount of the DyT inputs of the training forwards
(``helpers.InputRecorder``), never against satmon's own numbers. docs/reference/reliability.md counts :data:`LIFETIME`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder
from satmon import SaturationMonitor, find_dyt_layers
from satmon.drivers.lightning import STATE_KEY

#: the cases of this file, by name (docs/reference/reliability.md: "monitor lifetime cases")
LIFETIME = (
    "second-fit-finishes-a-partial-window",
    "second-fit-after-the-verdict-keeps-it",
    "new-trainer-and-model-start-afresh",
    "new-trainer-same-model-starts-afresh",
    "same-trainer-new-model-starts-afresh",
    "two-monitors-refused",
    "resume-layer-added",
    "resume-window-over-and-level-changed",
    "attached-after-the-window",
    "second-fit-after-an-exception",
    "second-fit-under-ddp",
)


def _fit(t, model, loader, **kw) -> list[str]:
    """``t.fit``; the satmon warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(model, loader, **kw)
    return [
        str(w.message) for w in caught if str(w.message).startswith("satmon") and "has no logger" not in str(w.message)
    ]


def _recorded(model) -> InputRecorder:
    return InputRecorder(model, [l.name for l in find_dyt_layers(model)])


def _pooled(counts: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(s for s, _ in counts.values()), sum(t for _, t in counts.values())


def _hooks_on(model) -> int:
    """Forward hooks on the model's DyT layers (satmon's, and the recorder's one a layer)."""
    return sum(len(l.module._forward_hooks) + len(l.module._forward_pre_hooks) for l in find_dyt_layers(model))


def test_a_second_fit_on_the_same_trainer_finishes_a_partial_window(tmp_path):
    """fit to step 3 of a 6-step window (provisional verdict), then fit on to step 8: the window closes at step 6
    with every DyT input of steps 0..5 counted (0.2: the partial verdict stayed, the window never finished)."""
    torch.manual_seed(0)
    model = tiny_lit(alpha_init=2.0)
    rec = _recorded(model)
    base = _hooks_on(model)
    monitor = SaturationMonitor(window=6, verbose=False)
    t = trainer(tmp_path, max_steps=3, callbacks=[monitor])
    _fit(t, model, token_loader(8))
    assert monitor.verdict.partial and monitor.verdict.window == 3
    assert _hooks_on(model) == base  # nothing of satmon stays on the model between fits
    t.fit_loop.epoch_loop.max_steps = 8
    said = _fit(t, model, token_loader(8))
    v = monitor.verdict
    assert t.global_step == 8 and not v.partial and (v.window, v.step) == (6, 6), said
    sat, total = _pooled(rec.counts(first=6))
    assert (v.elements, v.saturation) == (total, sat / total)
    assert _hooks_on(model) == base


def test_a_second_fit_after_the_verdict_keeps_it_and_hooks_nothing_twice(tmp_path):
    model = tiny_lit(alpha_init=2.0)
    monitor = SaturationMonitor(window=3, verbose=False, watch_every_n_steps=2)
    t = trainer(tmp_path, max_steps=4, callbacks=[monitor])
    _fit(t, model, token_loader(8))
    first = monitor.verdict.to_dict()
    t.fit_loop.epoch_loop.max_steps = 8
    said = _fit(t, model, token_loader(8))
    assert monitor.verdict.to_dict() == first and t.global_step == 8 and monitor.stop is None, said
    steps = [e["step"] for e in monitor.watch_log]
    assert steps[-1] > 4 and len(steps) == len(set(steps)), steps  # the watch went on in the second fit, once a step
    assert _hooks_on(model) == 0


@pytest.mark.parametrize("change", ["trainer-and-model", "trainer", "model"])
def test_a_new_trainer_or_model_starts_afresh_without_the_first_runs_verdict_or_stop(tmp_path, change):
    """0.2: the second run kept the first run's verdict, never counted, and abort_on="no-go" stopped it after one
    step on the first run's stop."""
    first_model = tiny_lit(alpha_init=0.1)  # NO-GO: the first run is stopped at the verdict
    monitor = SaturationMonitor(window=3, verbose=False, abort_on="no-go", watch_every_n_steps=0)
    t1 = trainer(tmp_path / "1", max_steps=6, callbacks=[monitor])
    _fit(t1, first_model, token_loader(8))
    assert monitor.stop.reason.value == "no-go" and t1.global_step == 3
    model = first_model if change == "trainer" else tiny_lit(alpha_init=500.0)  # GO
    t2 = t1 if change == "model" else trainer(tmp_path / "2", max_steps=6, callbacks=[monitor])
    if change == "model":
        t2.fit_loop.epoch_loop.max_steps = 9
    rec = _recorded(model)
    said = _fit(t2, model, token_loader(8))
    what = {"trainer-and-model": "another Trainer and model", "trainer": "another Trainer", "model": "another model"}[
        change
    ]
    assert [w for w in said if f"screened {what} before (verdict NO-GO at step 3)" in w and "new screen" in w], said
    v = monitor.verdict
    if change == "trainer":  # the same NO-GO model: its new run is stopped by its own verdict, at its window's end
        assert monitor.stop.step == 3 and t2.global_step == 3 and v.step == 3  # 0.2: after one step, on the old stop
    else:
        assert monitor.stop is None and t2.global_step == (9 if change == "model" else 6)
    if change == "model":  # the Trainer's step goes on from 3: the new model's screen starts after its window
        assert (
            v is None
            and "the window (3 optimizer steps) was over when the screen attached at step 3, and nothing "
            "had been counted before"
            in monitor.card()
        )
        return
    sat, total = _pooled(rec.counts(first=3))
    assert (v.elements, v.saturation) == (total, sat / total)  # the second model's window, counted afresh
    assert v.decision == ("go" if change == "trainer-and-model" else "no-go")


def test_two_monitors_in_one_trainer_are_refused_with_satmons_message(tmp_path):
    a, b = SaturationMonitor(window=3, verbose=False), SaturationMonitor(window=5, verbose=False)
    t = trainer(tmp_path, max_steps=2, callbacks=[a, b])  # 0.2: Lightning's "more than one stateful callback"
    with pytest.raises(
        ValueError, match=r"Expected one SaturationMonitor per Trainer, got 2: .*Put every setting in one"
    ):
        t.fit(tiny_lit(), token_loader(2))
    one = SaturationMonitor(window=3, verbose=False)
    assert one.state_key != a.state_key  # each its own key before setup, so Lightning lets them reach satmon's check
    t = trainer(tmp_path, max_steps=2, callbacks=[one])
    _fit(t, tiny_lit(), token_loader(2))
    assert one.state_key == STATE_KEY


@pytest.fixture(scope="module")
def saved_at_8(tmp_path_factory):
    """A 20-step window with layer ``blocks.1`` excluded, checkpointed at step 8 (mid-window)."""
    tmp = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    monitor = SaturationMonitor(window=20, verbose=False, exclude=r"^model\.blocks\.1\.")
    ckpt = ModelCheckpoint(dirpath=tmp, filename="{step}", every_n_train_steps=8, save_top_k=-1)
    t = trainer(tmp, max_steps=8, callbacks=[monitor, ckpt], enable_checkpointing=True)
    _fit(t, tiny_lit(alpha_init=2.0), token_loader(8))
    state = torch.load(tmp / "step=8.ckpt", map_location="cpu", weights_only=True)["callbacks"][STATE_KEY]
    assert state["steps_seen"] == 8 and all(".blocks.1." not in n for n in state["layers"])
    return tmp / "step=8.ckpt"


def test_a_resume_that_adds_a_layer_drops_the_counts_once_and_counts_what_remains(saved_at_8, tmp_path):
    """0.2: a RuntimeError out of trainer.fit at the first batch, training stopped."""
    model = tiny_lit(alpha_init=2.0)
    rec = _recorded(model)
    monitor = SaturationMonitor(window=12, verbose=False)  # blocks.1 counted again
    t = trainer(tmp_path, max_steps=14, callbacks=[monitor])
    said = _fit(t, model, token_loader(8), ckpt_path=str(saved_at_8))
    drop = [w for w in said if "another set of DyT layers (added" in w]
    assert len(drop) == 1 and "restarts counting at step 8 (4 of its 12 steps remain)" in drop[0], said
    v = monitor.verdict
    sat, total = _pooled(rec.counts(first=4))  # steps 8..11: the resumed run's first 4 forwards
    assert (v.step, v.window, v.elements, v.saturation) == (12, 4, total, sat / total)
    assert any(".blocks.1." in n for n in v.per_layer) and "window restarted at step 8" in monitor.card()


def test_a_resume_whose_window_is_over_and_level_changed_says_why_there_is_no_verdict(saved_at_8, tmp_path):
    """0.2: "the window restarts counting at step 8", then nothing was counted and no verdict ever came."""
    monitor = SaturationMonitor(window=5, level=3.0, verbose=False, exclude=r"^model\.blocks\.1\.")
    t = trainer(tmp_path, max_steps=10, callbacks=[monitor])
    said = _fit(t, tiny_lit(alpha_init=2.0), token_loader(8), ckpt_path=str(saved_at_8))
    assert (
        len(said) == 1
        and "level 3.0 (saved: 2.0)" in said[0]
        and "nothing is left to count, so there is no verdict" in said[0]
        and "restarts counting" not in said[0]
    ), said
    assert monitor.verdict is None and t.global_step == 10
    card = monitor.card()
    assert (
        card.startswith("satmon: no verdict")
        and "the window (5 optimizer steps) was over when the screen attached at "
        "step 8, and the counts saved before were dropped (level 3.0 (saved: 2.0)"
        in card
        and card.count("no verdict") == 2
    )


def test_a_monitor_attached_after_the_window_says_why_there_is_no_verdict(saved_at_8, tmp_path):
    ckpt = torch.load(saved_at_8, map_location="cpu", weights_only=True)
    ckpt["callbacks"] = {}  # a run without satmon until now
    torch.save(ckpt, tmp_path / "plain.ckpt")
    monitor = SaturationMonitor(window=5, verbose=False)
    t = trainer(tmp_path, max_steps=10, callbacks=[monitor])
    said = _fit(t, tiny_lit(alpha_init=2.0), token_loader(8), ckpt_path=str(tmp_path / "plain.ckpt"))
    assert monitor.verdict is None and len(said) == 1 and "nothing had been counted before" in said[0], said
    assert "set `window` above 8" in said[0] and "was over when the screen attached at step 8" in monitor.card()


class _FailsAt(type(tiny_lit())):
    at = 2

    def training_step(self, batch, batch_idx):
        if self.global_step == self.at and not getattr(self, "failed", False):
            self.failed = True
            raise RuntimeError("a fault in the user's training step")
        return super().training_step(batch, batch_idx)


def test_a_second_fit_after_an_exception_goes_on_from_the_counts_without_double_hooks(tmp_path):
    torch.manual_seed(0)
    model = _FailsAt(arch="gpt", d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=2.0, lr=3e-3, warmup=1)
    rec = _recorded(model)
    base = _hooks_on(model)
    monitor = SaturationMonitor(window=5, verbose=False)
    t = trainer(tmp_path, max_steps=6, callbacks=[monitor])
    with pytest.raises(RuntimeError, match="a fault in the user's training step"):
        _fit(t, model, token_loader(8))
    assert monitor.verdict is None and _hooks_on(model) == base
    _fit(t, model, token_loader(8))
    v = monitor.verdict
    sat, total = _pooled(rec.counts(first=5))  # the failed step raised before its forward: 5 forwards in the window
    assert not v.partial and (v.step, v.elements, v.saturation) == (5, total, sat / total)


def test_reliability_counts_these_cases():
    """docs/reference/reliability.md's lifetime figure is :data:`LIFETIME`, and every name in it is a case here."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "reliability.md").read_text()
    found = re.search(r"\*\*monitor lifetime cases\*\*: (\d+)", text)
    assert found and int(found.group(1)) == len(LIFETIME) == len(set(LIFETIME))
    here = Path(__file__).read_text()
    assert here.count("\ndef test_") - 1 + 2 == len(LIFETIME)  # one parametrised test holds three cases


DDP_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import torch
import lightning.pytorch as pl
from torch.utils.data import DataLoader, DistributedSampler
from helpers import tiny_lit, token_loader, trainer
from reference import InputRecorder
from satmon import SaturationMonitor
from satmon import find_dyt_layers

out = sys.argv[1]
torch.set_num_threads(1)


class Data(pl.LightningDataModule):
    def train_dataloader(self):
        data = token_loader(n_batches=16, batch_size=2).dataset
        t = self.trainer
        sampler = DistributedSampler(data, num_replicas=t.world_size, rank=t.global_rank, shuffle=False)
        return DataLoader(data, batch_size=2, shuffle=False, sampler=sampler)


pl.seed_everything(0, verbose=False)
lit = tiny_lit(alpha_init=50.0)
rec = InputRecorder(lit, [l.name for l in find_dyt_layers(lit)])
monitor = SaturationMonitor(window=6, verbose=False)
t = trainer(out, devices=2, strategy="ddp", num_nodes=1, max_steps=3, callbacks=[monitor],
            use_distributed_sampler=False)
t.fit(lit, datamodule=Data())
first = monitor.verdict.to_dict()
t.fit_loop.epoch_loop.max_steps = 8
t.fit(lit, datamodule=Data())
ref = rec.counts(first=6)
with open(f"{{out}}/rank-{{t.global_rank}}.json", "w") as f:
    json.dump(dict(first=first, verdict=monitor.verdict.to_dict(), steps=t.global_step,
                   sat=sum(s for s, _ in ref.values()), total=sum(n for _, n in ref.values())), f)
"""


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="needs gloo"
)
def test_a_second_fit_under_ddp_finishes_the_window_on_every_rank_with_the_summed_counts(tmp_path):
    """Two gloo ranks: the second fit continues from each rank's own counts (no collective when the run goes on);
    the window closes at step 6 on both, with the counts summed over the ranks (each rank's own float64 recount)."""
    import json
    import subprocess
    import sys

    from helpers import clean_env

    script = tmp_path / "run.py"
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).resolve().parent)))
    env = {**clean_env(), "MASTER_ADDR": "127.0.0.1", "TORCH_GLOO_TIMEOUT": "60"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert all(r["first"]["trust"] == "partial" and r["steps"] == 8 for r in ranks)
    v0, v1 = ranks[0]["verdict"], ranks[1]["verdict"]
    assert v0 == v1 and v0["trust"] != "partial" and (v0["window"], v0["step"]) == (6, 6)
    sat, total = sum(r["sat"] for r in ranks), sum(r["total"] for r in ranks)
    assert (v0["elements"], v0["saturation"]) == (total, sat / total)
