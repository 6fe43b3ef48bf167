"""Review of 0.3's faults and bad input (round 3): faults and inputs beyond the fault matrix's cases."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from satmon.dyt import DyT
from satmon.replaying.checkpoints import inspect_checkpoint, order_checkpoints
from satmon.replaying.loop import ModelLoader, checkpoint_records


class _Stateful(torch.nn.Module):
    """A model whose forward leaves state outside its state_dict: a non-persistent buffer it updates, or a cache of a
    weight filled at the first forward (a merged projection, a rotary table): a reused model would read stale state."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a, self.d, self.b, self.n = torch.nn.Linear(6, 8), DyT(8), torch.nn.Linear(8, 6), torch.nn.LayerNorm(6)
        self.register_buffer("scale", torch.ones(8), persistent=False)
        self._cache: torch.Tensor | None = None
        self.seen: dict[int, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.a.weight
        if self.how == "buffer":
            self.scale.mul_(2.0)
        elif self.how == "cache":
            if self._cache is None:
                self._cache = self.a.weight.detach().clone()
            w = self._cache
        elif self.how == "dict":
            w = self.seen.setdefault(0, self.a.weight.detach().clone())
        return self.n(self.b(self.d(torch.nn.functional.linear(x, w, self.a.bias) * self.scale)))


@pytest.mark.parametrize("how", ["buffer", "cache", "dict", "none"])
def test_state_a_forward_leaves_outside_the_state_dict_never_reaches_the_next_checkpoint(tmp_path, how):
    """Each record equals replaying its checkpoint alone (fresh model, fresh twin), whatever the forward left behind."""
    paths = []
    for i in range(3):
        torch.manual_seed(10 + i)
        net = _Stateful(how)
        with torch.no_grad():
            net.d.alpha.fill_(0.5 + i)
        paths.append(tmp_path / f"w{i}.pt")
        torch.save({"model": net.state_dict(), "iter_num": i}, paths[-1])
    batches = [torch.randn(16, 6, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    built = []

    def factory():
        built.append(1)
        return _Stateful(how)

    def readings(record):
        assert record.error is None, record.error
        d = record.report.to_dict()
        d.pop("elapsed_s", None)
        return d

    together = [
        readings(r)
        for r in checkpoint_records(
            order_checkpoints([inspect_checkpoint(p) for p in paths]), ModelLoader(factory=factory), batches
        )
    ]
    n_together = len(built)
    alone = [
        readings(next(iter(checkpoint_records([inspect_checkpoint(p)], ModelLoader(factory=factory), batches))))
        for p in paths
    ]
    assert together == alone
    assert len({d["verdict"]["saturation"] for d in together}) == 3
    if how == "none":  # nothing left behind: still one model and one twin for the three (and the meta check)
        assert n_together == 3


# ------------------------------------------------------------------ file names that are not UTF-8
_FACTORY = """import torch
from satmon.dyt import DyT


def net():
    return torch.nn.Sequential(torch.nn.Linear(6, 8), DyT(8), torch.nn.Linear(8, 6), torch.nn.LayerNorm(6))
"""


def _plain_run(tmp_path, names):
    (tmp_path / "nets.py").write_text(_FACTORY)
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    for i, name in enumerate(names):
        torch.manual_seed(i)
        net = torch.nn.Sequential(torch.nn.Linear(6, 8), DyT(8), torch.nn.Linear(8, 6), torch.nn.LayerNorm(6))
        torch.save({"model": net.state_dict(), "iter_num": i + 1}, os.fsdecode(os.path.join(os.fsencode(ckpts), name)))
    torch.save(torch.randn(32, 6, generator=torch.Generator().manual_seed(0)), tmp_path / "data.pt")
    return [
        "--factory",
        f"{tmp_path / 'nets.py'}:net",
        "--data",
        str(tmp_path / "data.pt"),
        "--batches",
        "2",
        "--quiet",
        "--logdir",
        str(tmp_path / "logs"),
    ]


@pytest.mark.skipif(sys.platform == "darwin", reason="APFS refuses file names that are not UTF-8")
def test_checkpoints_named_in_bytes_that_are_not_utf8_are_replayed_into_every_output(tmp_path, capsys):
    """0.3 before this fix: a UnicodeEncodeError traceback from the TensorBoard text of the first record, no JSON."""
    from satmon.cli.replay import main

    argv = _plain_run(tmp_path, [b"w\xff\xfe.pt", b"v\xe9.pt"])
    json_path, report = tmp_path / "r.json", tmp_path / "r.md"
    assert main([*argv, str(tmp_path / "ckpts"), "--json", str(json_path), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "w\\xff\\xfe.pt" in out and "v\\xe9.pt" in out
    records = json.loads(json_path.read_text(encoding="utf-8"))
    assert [Path(r["checkpoint"]).name for r in records] == ["w\\xff\\xfe.pt", "v\\xe9.pt"]
    assert all(r.get("error") is None for r in records)
    assert "w\\xff\\xfe.pt" in report.read_text(encoding="utf-8")


@pytest.mark.skipif(sys.platform == "darwin", reason="APFS refuses file names that are not UTF-8")
@pytest.mark.parametrize(
    "option, value",
    [("--logdir", b"lg\xff"), ("--name", b"n\xff"), ("--json", b"o\xff.json"), ("--report", b"r\xff.md")],
)
def test_an_output_named_in_bytes_that_are_not_utf8_is_refused_before_any_work(
    tmp_path, capsys, monkeypatch, option, value
):
    """0.3 before this fix: a traceback after every checkpoint was read (TensorBoard's path, the report's links)."""
    from satmon.cli.replay import main
    from satmon.replaying import loop

    argv = _plain_run(tmp_path, [b"w.pt"])
    monkeypatch.setattr(loop.ModelLoader, "load", lambda *a: pytest.fail("a checkpoint was read"))
    name = os.fsdecode(os.path.join(os.fsencode(tmp_path), value)) if option != "--name" else os.fsdecode(value)
    assert main([*argv, str(tmp_path / "ckpts"), option, name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"Expected {option} to be a UTF-8 name" in err[0]
    assert "\\xff" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "logs").exists()
