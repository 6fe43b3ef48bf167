"""Calibration batches: the data file forms, a datamodule (any failure one line, naming what to do),
captured batches kept safe from later changes, and the input rule."""

from __future__ import annotations

import pytest
import torch

from satmon.batches import feed_first
from satmon.demos.corpus import CorpusDataModule
from satmon.replaying.data import (
    capture_batches,
    datamodule_batches,
    input_forward_fn,
    load_data_file,
)
from satmon.replaying.user_code import ReplayUsageError


def test_data_file_forms(tmp_path):
    x = torch.arange(20).reshape(10, 2)
    torch.save(x, tmp_path / "t.pt")
    torch.save({"input_ids": x, "mask": x > 3}, tmp_path / "d.pt")
    torch.save([(x[:2], x[:2]), (x[2:4], x[2:4]), (x[4:6], x[4:6])], tmp_path / "l.pt")
    assert [b.tolist() for b in load_data_file(tmp_path / "t.pt", 2, batch_size=4)] == [x[:4].tolist(), x[4:8].tolist()]
    assert load_data_file(tmp_path / "t.pt", 5)[0] is not None and len(load_data_file(tmp_path / "t.pt", 5)) == 1
    (first,) = load_data_file(tmp_path / "d.pt", 1, batch_size=3)
    assert first["input_ids"].tolist() == x[:3].tolist() and first["mask"].tolist() == (x[:3] > 3).tolist()
    assert [b[0].tolist() for b in load_data_file(tmp_path / "l.pt", 2)] == [x[:2].tolist(), x[2:4].tolist()]


def test_data_file_errors(tmp_path):
    torch.save("a string", tmp_path / "s.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(ReplayUsageError, match="--data .*missing.pt': no such file"):
        load_data_file(tmp_path / "missing.pt", 1)
    with pytest.raises(
        ReplayUsageError, match="expected a tensor, a non-empty list of batches or a dict of tensors, got str"
    ):
        load_data_file(tmp_path / "s.pt", 1)
    with pytest.raises(ReplayUsageError, match=r"cannot read it with torch.load\(weights_only=True\)"):
        load_data_file(tmp_path / "text.pt", 1)


DM = dict(seq_len=16, batch_size=4, train_tokens=20_000, val_tokens=2_000, seed=0)


def test_datamodule_batches_are_its_first_training_batches():
    got = datamodule_batches(CorpusDataModule, DM, 2)
    dm = CorpusDataModule(**DM)
    dm.setup("fit")
    want = [b for _, b in zip(range(2), dm.train_dataloader())]
    assert len(got) == 2 and all(torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]) for g, w in zip(got, want))


@pytest.mark.parametrize(
    ("hparams", "cause"),
    [
        (dict(DM, seq_len=0), "ZeroDivisionError"),  # stored hyper-parameters that cannot work
        (dict(DM, train_tokens=3), "ValueError: Expected at least 17 tokens"),
        (dict(DM, no_such_arg=1), "TypeError"),
    ],
)
def test_datamodule_failures_are_one_line_naming_class_hparams_and_the_way_out(hparams, cause):
    with pytest.raises(ReplayUsageError) as e:
        datamodule_batches(CorpusDataModule, hparams, 2)
    msg = str(e.value)
    assert "\n" not in msg and cause in msg
    assert msg.startswith("--datamodule CorpusDataModule(**{") and repr(hparams)[1:-1] in msg
    assert "stored in the checkpoint" in msg and "--data FILE" in msg


def test_datamodule_that_yields_nothing():
    class Empty:
        def train_dataloader(self):
            return []

    with pytest.raises(ReplayUsageError, match=r"--datamodule Empty\(\): its train_dataloader\(\) yielded no batch"):
        datamodule_batches(Empty, {}, 2)


def test_captured_batches_are_detached_copies():
    w = torch.ones(2, 3, requires_grad=True)
    source = [(w * 2, torch.zeros(2, dtype=torch.long)), {"x": w * 3}, w * 4]
    got = capture_batches(iter(source), 2)
    assert len(got) == 2 and not got[0][0].requires_grad and not got[1]["x"].requires_grad
    with torch.no_grad():
        source[0][0].add_(100)
    assert got[0][0].tolist() == [[2.0] * 3] * 2  # a copy, not a view of the loader's tensor
    assert capture_batches(iter(source), 0) == []


def test_input_rule():
    x = torch.zeros(2, 8, dtype=torch.long)
    assert input_forward_fn([(x, x)]) is feed_first  # (inputs, integer targets of the same shape)
    assert input_forward_fn([(x, torch.zeros(2, 8))]) is None  # a float second tensor is an input
    assert input_forward_fn([(x, x[:, :4])]) is None
    assert input_forward_fn([x]) is None
    fn = input_forward_fn([{"input_ids": x, "labels": x}], input_key="input_ids")
    assert fn(lambda t: t.shape, {"input_ids": x, "labels": x}) == (2, 8)
    assert input_forward_fn([(x, x)], input_key="1")(lambda t: t is x, (None, x))
    with pytest.raises(ReplayUsageError, match="--input-key 'ids' does not select anything in a batch of type tuple"):
        input_forward_fn([(x, x)], input_key="ids")
