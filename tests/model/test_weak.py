"""``WeakModel``: how satmon's objects hold their model (weakly; ``required`` ones refuse a freed model)."""

from __future__ import annotations

import gc

import pytest
import torch

from helpers import assert_mentions
from satmon.model.weak import WeakModel


class Reader:
    model = WeakModel(required=True)
    other = WeakModel()


def test_a_required_model_read_after_it_was_freed_names_the_holder_and_held_does_not_raise():
    r, net = Reader(), torch.nn.Linear(2, 2)
    assert r.model is None and r.other is None  # never set: None, not an error
    r.model = r.other = net
    assert r.model is net and r.other is net and Reader.model.held(r) is net
    del net
    gc.collect()
    assert r.other is None and Reader.model.held(r) is None
    with pytest.raises(RuntimeError) as freed:
        _ = r.model
    assert_mentions(str(freed.value), "Reader", "freed")


def test_each_attribute_and_each_object_holds_its_own_model():
    a, b = Reader(), Reader()
    m1, m2, m3 = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    a.model, a.other, b.model = m1, m2, m3
    assert (a.model, a.other, b.model, b.other) == (m1, m2, m3, None)
    a.other = None
    assert a.other is None and a.model is m1
