"""Where Hugging Face users read the verdict (issue 38.3), on a real ``transformers.Trainer`` (CPU):
``trainer.state.log_history`` gets one satmon entry at the verdict (numbers as numbers), the checkpoints saved
after it hold it in ``trainer_state.json``, a window cut short gets its entry at train end, and with
``report_to=["tensorboard"]`` the card goes into the Trainer's own TensorBoard run, not ``runs/satmon``."""

from __future__ import annotations

import json

import pytest
from torch.utils.data import Dataset

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from test_hf_trainer import Tokens, llama  # noqa: E402
from transformers import Trainer  # noqa: E402

from integration_recipe import STEPS, WINDOW, hf_args  # noqa: E402
from satmon.drivers.hf import SatmonTrainerCallback  # noqa: E402


def _train(out, data: Dataset, window: int = WINDOW, **args):
    cb = SatmonTrainerCallback(window=window, verbose=False)
    trainer = Trainer(llama(), hf_args(out, **args), train_dataset=data, callbacks=[cb])
    trainer.train()
    return cb, trainer


def _satmon(history: list[dict]) -> list[dict]:
    return [h for h in history if any(k.startswith("satmon/") for k in h)]


def _expected(verdict) -> dict:
    """The entry, written from the verdict's fields (not from the function that builds it)."""
    out = {
        "satmon/decision": verdict.decision,
        "satmon/trust": verdict.trust,
        "satmon/source": "window",
        "satmon/window": verdict.window,
        "satmon/partial": int(verdict.partial),
        "satmon/threshold": verdict.threshold,
        "satmon/level": verdict.level,
        "satmon/saturation": verdict.saturation,
        "satmon/margin": verdict.margin,
        "step": verdict.step,
    }
    if verdict.planned_forecast:  # the forecast from the planned passes rides beside the decision (issue 34)
        out["satmon/forecast"] = verdict.planned_forecast["outcome"]
        # the run's scale, as data
        out.update(
            {
                f"satmon/{k}": float(verdict.planned_forecast[k])
                for k in ("params", "unique_tokens", "planned_tokens")
                if verdict.planned_forecast.get(k) is not None
            }
        )
    return out


def test_the_verdict_is_one_entry_of_log_history_and_of_later_checkpoints_and_tensorboard_is_the_trainers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb, trainer = _train(
        tmp_path, Tokens(), save_strategy="steps", save_steps=4, report_to=["tensorboard"], logging_steps=2
    )
    verdict = cb.verdict
    assert verdict is not None and verdict.step == WINDOW
    (entry,) = _satmon(trainer.state.log_history)
    epoch = entry.pop("epoch")
    assert entry == _expected(verdict)
    assert isinstance(epoch, float) and 0 < epoch <= trainer.state.epoch
    for key in ("satmon/saturation", "satmon/threshold", "satmon/margin", "satmon/level"):
        assert type(entry[key]) is float, key  # numbers where HF keeps numbers (not tensors, not strings)
    assert type(entry["step"]) is int and type(entry["satmon/window"]) is int
    # in the Trainer's order: after the loss logged at the verdict's step, before the next
    steps = [h["step"] for h in trainer.state.log_history]
    assert steps == sorted(steps)
    # the checkpoints: before the verdict none, after it the one entry (trainer_state.json is plain JSON)
    before = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    after = json.loads((tmp_path / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())["log_history"]
    assert _satmon(before) == [] and len(_satmon(after)) == 1
    assert {k: v for k, v in _satmon(after)[0].items() if k != "epoch"} == _expected(verdict)
    # report_to=["tensorboard"]: the card is in the Trainer's own run (runs/<date>_<host>), no runs/satmon
    runs = sorted(p for p in (tmp_path / "runs").iterdir())
    assert [p.name for p in runs] != ["satmon"] and len(runs) == 1, runs
    run = EventAccumulator(str(runs[0]), size_guidance={"tensors": 0, "scalars": 0})
    run.Reload()
    assert run.Tensors("satmon/verdict")[0].tensor_proto.string_val[0].decode() == verdict.card()
    assert "train/loss" in run.Tags()["scalars"]  # the Trainer's own scalars, in the same run


def test_a_window_cut_short_is_logged_at_train_end_as_partial(tmp_path):
    with pytest.warns(UserWarning, match=f"training ended after {STEPS} of the {WINDOW + 10} window steps"):
        cb, trainer = _train(tmp_path, Tokens(), window=WINDOW + 10)
    verdict = cb.verdict
    assert verdict is not None and verdict.partial and verdict.step == STEPS
    (entry,) = _satmon(trainer.state.log_history)
    assert entry["satmon/partial"] == 1 and entry["satmon/trust"] == verdict.trust == "partial"
    entry.pop("epoch")
    assert entry == _expected(verdict)
