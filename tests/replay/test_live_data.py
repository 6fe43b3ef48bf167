"""The live verdict a replay shows beside its own is read from what the live run wrote as data: the hparams session
(decision, trust, source, window, threshold) and the pooled-saturation scalar of a TensorBoard run, satmon's state
in a Lightning checkpoint or in a Hugging Face ``checkpoint-N/satmon_state.pt``; the card's prose is never parsed.
A real Trainer run (tiny DyT GPT-2, ``report_to=["tensorboard"]``) is found from its ``output_dir``."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

import satmon
from satmon.io.tensorboard import SummaryWriterSink, log_verdict
from satmon.replaying.live import live_from_tensorboard
from satmon.replaying.user_code import ReplayUsageError
from satmon.results.verdict import Rule, build_verdict


def _written(folder, verdict, card):
    sink = SummaryWriterSink(folder)
    log_verdict(sink, verdict, card=card)
    sink.close()
    return folder


def test_the_tensorboard_live_reading_comes_from_the_hparams_not_the_card(tmp_path):
    verdict = build_verdict(
        {"ln_f": (3, 10), "h.0": (7, 10)}, Rule(0.3, threshold_source="user"), step=8, window=8, planned_window=8
    )
    folder = _written(tmp_path / "run", verdict, card="### a card in other words, with no window and no trust")
    live = live_from_tensorboard(folder)
    assert (live.decision, live.step, live.window, live.trust, live.threshold) == (
        verdict.decision,
        verdict.step,
        verdict.window,
        verdict.trust,
        verdict.threshold,
    )
    assert live.saturation == pytest.approx(verdict.saturation, rel=1e-6)  # a float32 scalar in the event file


def test_a_probes_verdict_in_tensorboard_is_not_a_live_window(tmp_path):
    verdict = build_verdict({"ln_f": (3, 10)}, step=8, source="probe")
    folder = _written(tmp_path / "run", verdict, card=verdict.card() + "\nover a window of 8 optimizer steps")
    with pytest.raises(ReplayUsageError, match="no live satmon verdict there"):
        live_from_tensorboard(folder)


transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB, SEQ = 64, 16
CONFIG = dict(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2)


def _build():
    from transformers import GPT2Config, GPT2LMHeadModel

    return satmon.convert_to_dyt(GPT2LMHeadModel(GPT2Config(**CONFIG)))


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (16, SEQ), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """A Trainer run of 4 steps, screened over a window of 2, saving every 2 steps, reporting to TensorBoard."""
    from transformers import Trainer, TrainingArguments

    from satmon.drivers.hf import SatmonTrainerCallback

    root = tmp_path_factory.mktemp("hf_live")
    torch.manual_seed(0)
    args = TrainingArguments(
        str(root / "out"),
        use_cpu=True,
        report_to=["tensorboard"],
        max_steps=4,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1000,
        disable_tqdm=True,
        dataloader_num_workers=0,
        learning_rate=1e-2,
    )
    callback = SatmonTrainerCallback(window=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = _tokens()  # a list of examples is a dataset to the Trainer
        Trainer(_build(), args, train_dataset=[{"input_ids": t, "labels": t} for t in x], callbacks=[callback]).train()
    return root / "out", callback.screen.verdict, [x[:4]]


def test_a_trainer_output_dir_gives_its_live_verdict_from_satmons_state_then_its_runs(hf_run, tmp_path):
    out, verdict, batches = hf_run
    assert verdict is not None and verdict.source == "window"
    assert list((out / "runs").iterdir()) and (out / "checkpoint-4" / "satmon_state.pt").is_file()
    run = satmon.replay(out, factory=_build, data=batches, twin=False, device="cpu", on_note=None)
    live = run.source.live
    assert live is not None, run.source.missing
    assert (live.decision, live.saturation, live.threshold, live.step, live.window, live.trust) == (
        verdict.decision,
        verdict.saturation,
        verdict.threshold,
        verdict.step,
        verdict.window,
        verdict.trust,
    )
    assert live.found == "satmon's state saved in `checkpoint-4/satmon_state.pt`"
    run.close()
    bare = tmp_path / "out"  # the same output_dir without satmon's state: the Trainer's TensorBoard run says it
    shutil.copytree(out, bare, ignore=shutil.ignore_patterns("satmon_state.pt"))
    run = satmon.replay(bare, factory=_build, data=batches, twin=False, device="cpu", on_note=None)
    live = run.source.live
    assert live is not None, run.source.missing
    assert (live.decision, live.threshold, live.step, live.window, live.trust) == (
        verdict.decision,
        verdict.threshold,
        verdict.step,
        verdict.window,
        verdict.trust,
    )
    assert live.saturation == pytest.approx(verdict.saturation, rel=1e-6) and "/runs/" in live.found
    run.close()
