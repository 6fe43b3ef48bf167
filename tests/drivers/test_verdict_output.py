"""Every driver prints the verdict the same way: its plain-text card, on stdout, once; ``card()`` works for any model.

The Lightning callback, the Hugging Face callback and a plain-loop Screen print ``verdict.text()``
(no markdown) to stdout and nothing of it to stderr. For a model without DyT, ``monitor.verdict`` is
``None`` and ``monitor.card()`` says there is no screen and why; the README's Usage example runs on
such a model too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import tiny_lit, token_loader, trainer

import satmon
from satmon import SaturationMonitor

README = Path(__file__).resolve().parents[2] / "README.md"


def _once_in_plain_text(out: str, err: str, verdict) -> None:
    assert out.count("satmon verdict:") == 1 and "satmon verdict:" not in err
    assert verdict.text() in out
    assert "###" not in out and "**" not in out


def test_lightning_prints_the_plain_card_once_on_stdout(tmp_path, capsys):
    monitor = SaturationMonitor(window=2)
    trainer(tmp_path, max_steps=3, callbacks=[monitor]).fit(tiny_lit(), token_loader(4))
    out, err = capsys.readouterr()
    _once_in_plain_text(out, err, monitor.verdict)
    assert monitor.card() == monitor.verdict.text() and monitor.card(markdown=True) == monitor.verdict.card()


def test_a_plain_loop_screen_prints_the_same_way(capsys):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), satmon.DyT(8, alpha_init=2.0))
    screen = satmon.Screen(window=2).attach(model)
    for _ in range(3):
        screen.step(model(torch.randn(4, 8)).square().mean())
    out, err = capsys.readouterr()
    _once_in_plain_text(out, err, screen.verdict)


def test_the_hf_callback_prints_the_same_way(tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from integration_recipe import hf_args
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer

    from satmon.drivers.hf import SatmonTrainerCallback

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=16)
    model = satmon.convert_to_dyt(LlamaForCausalLM(cfg), alpha_init=20.0, rmsnorm=True)
    x = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": r, "labels": r} for r in x]
    cb = SatmonTrainerCallback(window=2)
    Trainer(model, hf_args(tmp_path, max_steps=2), train_dataset=data, callbacks=[cb]).train()
    out, err = capsys.readouterr()
    _once_in_plain_text(out, err, cb.verdict)


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
    assert screen.verdict is None and screen.card().startswith("satmon: no screen") and "convert_to_dyt" in screen.card()


def _usage_block() -> str:
    text = README.read_text()
    section = text[text.index("## Usage"):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_usage_example_works_on_a_model_without_dyt(tmp_path, monkeypatch, capsys):
    code = _usage_block()
    assert 'norm="dyt"' in code and "monitor.card()" in code
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="no DyT layer"):
        exec(compile(code.replace('norm="dyt"', 'norm="layernorm"'), "README.md:Usage", "exec"), {})  # noqa: S102 (the README's own code)
    out = capsys.readouterr().out
    assert "satmon: no screen" in out and "satmon verdict" not in out


def test_the_readme_usage_example_prints_the_verdict_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_usage_block(), "README.md:Usage", "exec"), namespace)  # noqa: S102 (the README's own code)
    out = capsys.readouterr().out
    assert out.count("satmon verdict:") == 1 and namespace["verdict"].text() in out
