"""A model satmon watched is freed once its user lets go of it, with every hook set on; the model object is freed even
while the user keeps the screen (for its card, in a list of runs), and every module of it once the screen goes too:
satmon's hooks live on the model, the model map's cache holds its layers, and the screen holds its hook sets, so
nothing reached from them may hold the model itself. (The modules and parameters the screen reads stay while the
screen does.) Kept alive, a plain loop's model would stay in memory for the rest of the process (a sweep or a notebook
piles them up), and a DDP model would outlive ``destroy_process_group``, where freeing it can deadlock
(docs/reference/distributed.md)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from test_watch_from import Gated

from helpers import assert_mentions
from satmon import Screen, convert_to_dyt


def _watched(make, example, batch, loss_of, keep_inputs=None, **options) -> weakref.ref:
    """Train a model under a screen in a plain loop, leave no reference behind but a weak one."""
    model = make()
    screen = Screen(info=lambda line: None, warn=lambda line: None, **options)
    screen.attach(model, example_input=example, keep_inputs=keep_inputs)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(12):
        loss = loss_of(model, batch())
        loss.backward()
        opt.step()
        opt.zero_grad()
        screen.step(loss)
    assert screen.steps_seen > 0 and screen.watch is not None and screen.trap is not None
    return weakref.ref(model)


@pytest.mark.parametrize("product", ["exact", "module"])
@pytest.mark.parametrize("keep_inputs", [True, False])
def test_a_gated_model_is_freed_after_a_screen_with_every_watch(product, keep_inputs):
    ref = _watched(
        Gated,
        torch.randn(2, 4),
        lambda: torch.randn(5, 4),
        lambda m, x: m(x).square().mean(),
        window=6,
        watch_every_n_steps=3,
        watch_from=2,
        trap_every_n_steps=2,
        product=product,
        keep_inputs=keep_inputs,
    )
    gc.collect()
    assert ref() is None


def test_a_hugging_face_llama_is_freed_after_a_screen():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    ref = _watched(
        lambda: convert_to_dyt(transformers.LlamaForCausalLM(cfg), alpha_init=4.0, rmsnorm=True),
        torch.randint(0, 64, (2, 8)),
        lambda: torch.randint(0, 64, (2, 8)),
        lambda m, x: m(x, labels=x).loss,
        window=6,
        watch_every_n_steps=3,
        watch_from=2,
        trap_every_n_steps=2,
    )
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("steps", [0, 4, 12], ids=["attached", "in the window", "after the verdict"])
def test_a_model_is_freed_while_its_screen_is_kept_and_the_card_stays(steps):
    model = Gated()
    screen = Screen(
        info=lambda line: None,
        warn=lambda line: None,
        window=6,
        watch_every_n_steps=3,
        watch_from=2,
        trap_every_n_steps=2,
    )
    screen.attach(model, example_input=torch.randn(2, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(torch.randn(5, 4)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        screen.step(loss)
    assert (screen.verdict is not None) == (steps > 6)
    card, state = screen.card(), screen.state_dict()
    ref = weakref.ref(model)
    modules = [weakref.ref(m) for m in model.modules()]
    del model, opt
    gc.collect()
    assert ref() is None
    assert screen.card() == card and screen.state_dict() == state  # what the screen read is kept
    del screen
    gc.collect()
    assert not [m() for m in modules if m() is not None]  # nothing of the model outlives its screen


def test_a_step_after_the_model_was_freed_is_refused_and_finish_still_gives_the_verdict():
    torch.manual_seed(0)
    model = Gated()
    screen = Screen(info=lambda line: None, warn=lambda line: None, window=6, trap_every_n_steps=2)
    screen.attach(model, example_input=torch.randn(2, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(3):
        loss = model(torch.randn(5, 4)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        screen.step(loss)
    del model, opt
    gc.collect()
    with pytest.raises(RuntimeError) as refused:
        screen.step(loss)
    assert_mentions(str(refused.value), "Screen.step()", "freed", "screen.finish()")
    assert screen.steps_seen == 3  # the refused step counted nothing
    screen.finish()
    assert screen.verdict is not None and screen.verdict.window == 3


@pytest.mark.parametrize("freed", [False, True])
def test_a_screen_attached_to_a_second_model_is_refused_whether_the_first_is_alive_or_freed(freed):
    first = Gated()
    screen = Screen(info=lambda line: None, warn=lambda line: None, window=6)
    screen.attach(first, example_input=torch.randn(2, 4))
    if freed:
        del first
        gc.collect()
    with pytest.raises(RuntimeError) as refused:
        screen.attach(Gated(), example_input=torch.randn(2, 4))
    assert_mentions(str(refused.value), "since freed" if freed else "(Gated)", "Make a new Screen")
