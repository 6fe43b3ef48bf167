"""DyT made on the meta device gets its init on every materialising path, and a DyT that did not is named before the
window starts (issue 44.1)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import satmon
from satmon import DyT, convert_to_dyt
from satmon.demos.gpt import GPT, GPTConfig
from satmon.model.dyt_init import dyt_parameter_problems


def _garbage(model: nn.Module) -> None:
    """What to_empty() may leave: non-finite alphas and subnormal weights."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, DyT):
                m.alpha.fill_(float("nan"))
                m.weight.fill_(4.6e-41)


def _at_init(model: nn.Module, alpha: float) -> None:
    dyts = [m for m in model.modules() if isinstance(m, DyT)]
    assert dyts
    for m in dyts:
        assert float(m.alpha.detach()) == pytest.approx(alpha) and bool((m.weight == 1).all())
        assert m.bias is None or bool((m.bias == 0).all())


def test_meta_then_to_empty_then_reset_parameters_gives_the_init():
    with torch.device("meta"):
        model = GPT(GPTConfig(n_layers=2))
    model.to_empty(device="cpu")
    _garbage(model)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    alpha = next(m for m in model.modules() if isinstance(m, DyT)).alpha_init
    _at_init(model, alpha)


def _hf_llama_on_meta(alpha: float = 0.7):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    with torch.device("meta"):
        model = convert_to_dyt(transformers.LlamaForCausalLM(config), rmsnorm=True, alpha_init=alpha)
    model.to_empty(device="cpu")
    _garbage(model)
    return model


def test_hugging_face_init_weights_initialises_the_converted_dyt():
    model = _hf_llama_on_meta()
    model.init_weights()  # transformers' own _init_weights does not know DyT; the converter taught it
    _at_init(model, 0.7)
    assert torch.isfinite(model(torch.zeros(1, 4, dtype=torch.long)).logits).all()


def test_the_issue_sequence_reset_then_init_weights_gives_the_init():
    model = _hf_llama_on_meta()
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    model.init_weights()
    _at_init(model, 0.7)
    assert float(model.model.layers[0].input_layernorm.alpha) == pytest.approx(0.7)


def test_a_taught_model_pickles_and_copies():
    model = _hf_llama_on_meta()
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        twin.init_weights()
        _at_init(twin, 0.7)


def test_an_uninitialised_dyt_is_named_when_the_screen_attaches():
    model = nn.Sequential(nn.Linear(4, 4), DyT(4), nn.Linear(4, 4), DyT(4))
    with torch.no_grad():
        model[3].alpha.fill_(1.2e8)
    with pytest.warns(
        UserWarning, match=r"satmon: DyT layer 3: alpha = 1\.2e\+08.*look uninitialised.*reset_parameters"
    ):
        satmon.Screen(window=2, verbose=False).attach(model)


def test_finite_and_initialised_layers_say_nothing():
    assert dyt_parameter_problems([("a", DyT(4)), ("b", DyT(4, alpha_init=2.0))]) == []
    with torch.device("meta"):
        assert dyt_parameter_problems([("meta", DyT(4))]) == []  # no values to read
    bad = DyT(4)
    with torch.no_grad():
        bad.weight[0] = float("inf")
    assert "1 weight/bias value(s) not finite" in dyt_parameter_problems([("bad", bad)])[0]
