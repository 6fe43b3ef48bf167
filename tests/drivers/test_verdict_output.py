"""Every driver prints the verdict the same way: one line by default, the plain-text card with ``verbose=True``, on
stdout, once; ``card()`` works for any model; the Hugging Face callback reports through ``report_to``.

The one line (:meth:`Verdict.summary`) holds the decision, its trust, the saturation against the threshold and where
the card went, as Lightning's and Hugging Face's own monitors print one line or none. For a model without DyT,
``monitor.verdict`` is ``None`` and ``monitor.card()`` says there is no screen and why; the README's Usage example
runs on such a model too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import satmon
from helpers import assert_mentions, tiny_lit, token_loader, trainer
from satmon import SaturationMonitor

README = Path(__file__).resolve().parents[2] / "README.md"


def _one_line(out: str, err: str, verdict, where: list[str]) -> None:
    lines = [l for l in out.splitlines() if "satmon verdict" in l]
    assert lines == [verdict.summary(where)] and "satmon verdict" not in err
    assert "| layer |" not in out and "Caveat" not in out  # not the card


def _card_once(out: str, err: str, verdict) -> None:
    assert out.count("satmon verdict:") == 1 and "satmon verdict:" not in err
    assert verdict.text() in out
    assert "###" not in out and "**" not in out


def test_lightning_prints_one_line_by_default_and_the_card_with_verbose(tmp_path, capsys):
    monitor = SaturationMonitor(window=2)
    trainer(tmp_path, max_steps=3, callbacks=[monitor]).fit(tiny_lit(), token_loader(4))
    out, err = capsys.readouterr()
    _one_line(out, err, monitor.verdict, [])  # no logger: the line says the card went nowhere
    assert_mentions(out.strip().splitlines()[-1], "card: not written anywhere", "no logger", "no logdir")
    assert monitor.card() == monitor.verdict.text() and monitor.card(markdown=True) == monitor.verdict.card()
    loud = SaturationMonitor(window=2, verbose=True)
    trainer(tmp_path, max_steps=3, callbacks=[loud]).fit(tiny_lit(), token_loader(4))
    _card_once(*capsys.readouterr(), loud.verdict)


def test_a_plain_loop_screen_prints_the_same_way(tmp_path, capsys):
    for verbose in (False, True):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), satmon.DyT(8, alpha_init=2.0))
        screen = satmon.Screen(window=2, logdir=tmp_path / str(verbose), verbose=verbose).attach(model)
        for _ in range(3):
            screen.step(model(torch.randn(4, 8)).square().mean())
        screen.detach()
        out, err = capsys.readouterr()
        if verbose:
            _card_once(out, err, screen.verdict)
        else:
            _one_line(out, err, screen.verdict, [f"TensorBoard {tmp_path / 'False'}"])


def _hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    model = satmon.convert_to_dyt(LlamaForCausalLM(cfg), alpha_init=20.0, rmsnorm=True)
    x = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(1))
    return model, [{"input_ids": r, "labels": r} for r in x]


def _hf_train(tmp_path: Path, **args):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import Trainer

    from integration_recipe import hf_args
    from satmon.drivers.hf import SatmonTrainerCallback

    model, data = _hf_llama()
    cb = SatmonTrainerCallback(window=2)
    Trainer(model, hf_args(tmp_path, max_steps=2, **args), train_dataset=data, callbacks=[cb]).train()
    return cb


def test_the_hf_callback_prints_one_line_in_its_own_tensorboard_run_without_report_to(tmp_path, capsys):
    cb = _hf_train(tmp_path)  # report_to="none"
    out, err = capsys.readouterr()
    _one_line(out, err, cb.verdict, [f"TensorBoard {tmp_path / 'runs' / 'satmon'}"])


def test_the_hf_callback_reports_into_hugging_faces_tensorboard_run(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb = _hf_train(tmp_path, report_to=["tensorboard"])
    [run] = [p for p in (tmp_path / "runs").iterdir()]  # one run: Hugging Face's, no folder of satmon's
    assert run.name != "satmon"
    ea = EventAccumulator(str(run), size_guidance={"tensors": 0}).Reload()
    cards = [e.tensor_proto.string_val[0].decode() for e in ea.Tensors("satmon/verdict")]
    # Hugging Face's own text beside
    assert cards == [cb.verdict.card()] and "args/text_summary" in ea.Tags()["tensors"]
    _one_line(*capsys.readouterr(), cb.verdict, [f"TensorBoard {run}"])


def test_the_hf_callback_reports_into_hugging_faces_mlflow_run(tmp_path, trackers, capsys):
    cb = _hf_train(tmp_path, report_to=["mlflow"])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    [run] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert (run.data.params["satmon/decision"], run.data.params["satmon/trust"]) == (
        cb.verdict.decision,
        cb.verdict.trust,
    )
    card = Path(client.download_artifacts(run.info.run_id, "satmon_verdict.md", str(tmp_path))).read_text()
    assert card.strip() == cb.verdict.card()
    assert not (tmp_path / "runs" / "satmon").exists()  # no TensorBoard folder of satmon's when report_to names one
    _one_line(*capsys.readouterr(), cb.verdict, [f"MLflow run {run.info.run_id} (artifact satmon_verdict.md)"])


def test_an_integration_satmon_has_no_writer_for_gets_the_card_as_a_file(tmp_path):
    from transformers import TrainingArguments

    from satmon.drivers.hf import SatmonTrainerCallback

    args = TrainingArguments(str(tmp_path), report_to="none")
    args.report_to = ["comet_ml"]  # as post-init leaves a list; no run is opened: only where satmon writes is read
    logdir, sink = SatmonTrainerCallback()._destinations(args)
    assert logdir is None and sink.text("satmon/verdict", "### card", 2) == [str(tmp_path / "satmon_verdict.md")]
    assert (tmp_path / "satmon_verdict.md").read_text() == "### card\n"


def test_a_model_without_dyt_gets_a_card_that_says_why(tmp_path):
    monitor = SaturationMonitor(window=2)
    with pytest.warns(UserWarning, match="no DyT layer"):
        trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(tiny_lit(norm="layernorm"), token_loader(2))
    assert monitor.verdict is None
    card = monitor.card()
    assert card.startswith("satmon: no screen") and "convert_to_dyt" in card and "###" not in card
    assert monitor.card(markdown=True).startswith("### satmon: no screen")


def test_a_plain_loop_without_dyt_gets_a_card_too():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    with pytest.warns(UserWarning, match="no DyT layer"):
        screen = satmon.Screen(window=2, verbose=False).attach(model)
    assert (
        screen.verdict is None and screen.card().startswith("satmon: no screen") and "convert_to_dyt" in screen.card()
    )


def _usage_block() -> str:
    """README's minimal example: its first python block."""
    return re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL).group(1)


def test_the_readme_usage_example_works_on_a_model_without_dyt(tmp_path, monkeypatch, capsys):
    code = _usage_block()
    assert 'norm="dyt"' in code and "monitor.card()" in code
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="no DyT layer"):
        exec(compile(code.replace('norm="dyt"', 'norm="layernorm"'), "README.md:Usage", "exec"), {})  # noqa: S102 (the README's own code)
    out = capsys.readouterr().out
    assert "satmon: no screen" in out and "satmon verdict" not in out


def test_the_readme_usage_example_prints_one_line_then_the_card(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_usage_block(), "README.md:Usage", "exec"), namespace)  # noqa: S102 (the README's own code)
    out = capsys.readouterr().out
    verdict = namespace["verdict"]
    [line] = [l for l in out.splitlines() if l.startswith("satmon verdict:") and "card: " in l]
    assert line == verdict.summary([f"TensorBoard {Path('tb_logs', 'lightning_logs', 'version_0')}"])
    assert out.count("satmon verdict:") == 2 and verdict.text() in out  # the line at the verdict, then print(card())


def test_the_hf_callback_reports_into_hugging_faces_wandb_run(tmp_path, trackers, monkeypatch, capsys):
    import glob
    import json

    from trackers import finished_run

    monkeypatch.setenv("WANDB_PROJECT", "satmon")
    cb = _hf_train(tmp_path, report_to=["wandb"])
    import wandb

    run_id = None
    if wandb.run is not None:
        run_id = wandb.run.id
        wandb.finish()
    [run_file] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    config, history = finished_run(run_file)
    assert (config["satmon/decision"], config["satmon/trust"]) == (cb.verdict.decision, cb.verdict.trust)
    assert [h["Satmon/decision"] for h in history if "Satmon/decision" in h] == [1.0 if cb.verdict.go else 0.0]
    [table] = glob.glob(str(Path(run_file).parent / "files" / "media" / "table" / "satmon" / "verdict_*.table.json"))
    assert json.loads(Path(table).read_text())["data"] == [[cb.verdict.card()]]
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("satmon verdict:")][-1]
    assert_mentions(
        line.split("card: ", 1)[1],
        f"W&B run {run_id or Path(run_file).stem.removeprefix('run-')}",
        "table satmon/verdict",
    )
