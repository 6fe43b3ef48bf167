"""``SatmonTrainerCallback`` on a real ``transformers.Trainer`` (CPU): the verdict of the plain ``Screen`` and of the
Lightning callback on the same model, data and seed; evaluation forwards left out; a stop through
``control.should_training_stop``; a resume that restores the counts; the card and scalars in TensorBoard."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import LlamaConfig, LlamaForCausalLM, Trainer  # noqa: E402

import satmon  # noqa: E402
from integration_recipe import (
    BATCH,
    LR,
    STEPS,
    WINDOW,
    LossLM,
    TokenDicts,
    comparable,
    gpt,
    hf_args,
    lightning_run,
    phase_line,
)  # noqa: E402
from satmon.drivers.hf import STATE_FILE, SatmonTrainerCallback  # noqa: E402

VOCAB, SEQ = 64, 16


def llama() -> torch.nn.Module:
    """A 2-block LLaMA built from a config (SwiGLU: gated), its RMSNorms converted to DyT."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return satmon.convert_to_dyt(LlamaForCausalLM(cfg), alpha_init=20.0, rmsnorm=True)


class Tokens(Dataset):
    def __init__(self, n: int = STEPS * BATCH) -> None:
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}  # the model shifts the labels itself


def hf_run(out: Path, model: torch.nn.Module, data: Dataset, resume: str | None = None, **options):
    """Train with the callback; returns ``(callback, trainer)``."""
    args = hf_args(
        out,
        **{
            k: options.pop(k)
            for k in list(options)
            if k in ("save_strategy", "save_steps", "eval_strategy", "eval_steps", "max_steps")
        },
    )
    cb = SatmonTrainerCallback(window=WINDOW, verbose=False, **options)
    trainer = Trainer(model, args, train_dataset=data, eval_dataset=data, callbacks=[cb])
    trainer.train(resume_from_checkpoint=resume)
    return cb, trainer


def plain_llama_screen(steps: int = STEPS) -> satmon.Screen:
    """The reference: a plain loop over the same batches with the same optimizer, screened by ``satmon.Screen``."""
    model = llama()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    batches = list(DataLoader(Tokens(), batch_size=BATCH, shuffle=False))[:steps]
    # the callback traces its first training batch for gating (gate statistics from the first step): so does this
    screen = satmon.Screen(window=WINDOW, verbose=False).attach(model, example_input=batches[0])
    for batch in batches:
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        screen.step(loss)
    screen.finish()
    screen.detach()
    return screen


def counted(verdict: satmon.Verdict) -> tuple:
    """What the window's counts decide: the decision, pooled and per-layer saturation, elements, window, step."""
    return (
        verdict.decision,
        verdict.saturation,
        verdict.per_layer,
        verdict.elements,
        verdict.nonfinite,
        verdict.window,
        verdict.step,
    )


def screened(verdict: satmon.Verdict) -> dict:
    """The verdict less the card's phase-diagram line and forecast (a plain Screen is given no dataloader to count
    tokens in, nor the trainer's steps)."""
    from satmon.results.scale import RunScale

    d = verdict.to_dict()
    d["notes"] = [n for n in d["notes"] if not RunScale.is_note(n)]
    d.pop("planned_forecast")
    return d


@pytest.fixture(scope="module")
def reference() -> satmon.Screen:
    return plain_llama_screen()


def test_verdict_equals_the_plain_screens(tmp_path, reference):
    model = llama()
    cb, trainer = hf_run(tmp_path, model, Tokens())
    assert trainer.state.global_step == STEPS and cb.stop is None
    assert screened(cb.verdict) == screened(reference.verdict)
    # the card places the run as the Lightning callback's does: the model's parameters (tied ones once) and the
    # dataloader's unique tokens (every sample's ids, counted here by hand)
    params = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    tokens = sum(int(Tokens()[i]["input_ids"].numel()) for i in range(len(Tokens())))
    phase = [n for n in cb.verdict.notes if n.startswith("Phase diagram:")]
    assert len(phase) == 1 and f"{params:,} parameters, {tokens:,} unique training tokens" in phase[0], phase
    # the planned passes: max_steps x per-device batch x accumulation (1) x world size (1) x SEQ tokens over the unique
    planned = cb.verdict.planned_forecast
    assert planned["planned_tokens"] == trainer.state.max_steps * BATCH * SEQ and planned["unique_tokens"] == tokens
    assert cb.verdict.gated  # SwiGLU: the gate hooks ran too
    assert 0.05 < cb.verdict.saturation < 0.95 and cb.verdict.window == WINDOW


def test_the_trap_reading_equals_the_plain_screens(tmp_path, reference):
    """The trap watch reads gradients from hooks on the parameters, not from a driver: the Trainer's checks are the
    plain loop's, step for step (its gradient clipping comes after the read)."""
    cb, _ = hf_run(tmp_path, llama(), Tokens())
    got, want = cb.screen.trap.log, reference.trap.log
    assert got and [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1, 10))
    for a, b in zip(got, want):
        assert a["final"] == b["final"] == "model.norm" and a["trapped"] == b["trapped"]
        assert a["reach"] == pytest.approx(b["reach"], rel=1e-5)


def test_evaluation_forwards_are_not_counted(tmp_path, reference):
    cb, trainer = hf_run(tmp_path, llama(), Tokens(), eval_strategy="steps", eval_steps=2)
    assert any("eval_loss" in h for h in trainer.state.log_history)  # evaluation ran inside the window
    assert screened(cb.verdict) == screened(reference.verdict)


def test_verdict_equals_the_lightning_callbacks(tmp_path):
    monitor = lightning_run(tmp_path / "lightning")
    cb, _ = hf_run(tmp_path / "hf", LossLM(gpt()), TokenDicts())  # the demo GPT, nested as `model` like LitLM's
    assert comparable(cb.verdict) == comparable(monitor.verdict)
    assert phase_line(cb.verdict) == phase_line(monitor.verdict)  # the same parameters and tokens, counted alike


def test_abort_policy_stops_the_trainer(tmp_path, reference):
    assert reference.verdict.decision == "no-go"  # 0.27 < 0.43, no collapse risk
    cb, trainer = hf_run(tmp_path, llama(), Tokens(), abort_on="no-go")
    assert trainer.state.global_step == WINDOW < STEPS  # control.should_training_stop ended train() at the verdict
    assert cb.stop.reason == satmon.StopReason.NO_GO and cb.stop.step == WINDOW
    assert cb.verdict.saturation == reference.verdict.saturation


def test_resume_from_checkpoint_restores_the_counts(tmp_path, reference):
    saved = dict(save_strategy="steps", save_steps=3)
    first, _ = hf_run(tmp_path, llama(), Tokens(), **saved)
    assert screened(first.verdict) == screened(reference.verdict)
    state = torch.load(tmp_path / "checkpoint-3" / STATE_FILE, weights_only=True)
    partial = plain_llama_screen(steps=3).state_dict()
    assert (state["saturated"], state["total"], state["steps_seen"]) == (partial["saturated"], partial["total"], 3)

    resumed, trainer = hf_run(tmp_path, llama(), Tokens(), resume=str(tmp_path / "checkpoint-3"), **saved)
    assert trainer.state.global_step == STEPS
    # the counts of steps 1-3 restored, those of 4-6 added (the saved state holds the counts,
    # not gate or offset statistics)
    assert counted(resumed.verdict) == counted(reference.verdict)

    os.remove(tmp_path / "checkpoint-3" / STATE_FILE)
    with pytest.warns(UserWarning, match="without a saved screen"):
        lost, _ = hf_run(tmp_path, llama(), Tokens(), resume=str(tmp_path / "checkpoint-3"), **saved)
    assert lost.verdict.window == WINDOW - 3 and lost.verdict.elements == reference.verdict.elements // 2


def test_card_and_scalars_go_to_tensorboard(tmp_path, reference):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb, _ = hf_run(tmp_path, llama(), Tokens())
    run = EventAccumulator(str(tmp_path / "runs" / "satmon"), size_guidance={"tensors": 0, "scalars": 0})
    run.Reload()
    card = run.Tensors("satmon/verdict")[0].tensor_proto.string_val[0].decode()
    assert card == cb.verdict.card()
    (event,) = run.Scalars("Satmon/saturation")[-1:]
    assert (event.step, event.value) == (WINDOW, pytest.approx(reference.verdict.saturation, rel=1e-6))


def test_a_model_without_dyt_trains_unscreened_or_is_refused(tmp_path):
    torch.manual_seed(0)
    plain = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
        )
    )
    with pytest.warns(UserWarning, match="no DyT layer in LlamaForCausalLM"):
        cb, trainer = hf_run(tmp_path, plain, Tokens())
    assert trainer.state.global_step == STEPS and cb.verdict is None
    with pytest.raises(ValueError, match="on_missing='raise'"):
        hf_run(tmp_path, plain, Tokens(), on_missing="raise")
