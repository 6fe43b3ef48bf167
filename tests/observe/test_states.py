"""SumStates (satmon.observe.states): sums that add across processes in one packed all_reduce, exact for
int64 counts of any size; reset in place; state dicts. The 2-process test runs gloo on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from satmon.observe.states import SumStates, _pack, _unpack, all_reduce_sum


class Counts(SumStates):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.add_state("hits", torch.zeros(n, dtype=torch.int64))
        self.add_state("mass", torch.zeros(n, dtype=torch.float64))


def test_pack_round_trips_int64_counts_beyond_two_to_the_53_exactly():
    big = torch.tensor([0, 1, 2**53 + 1, 2**61 + 12345, 2**32 - 1, 2**32])
    mass = torch.tensor([0.1, -2.5, 1e300])
    back = _unpack(_pack([big, mass]), [big, mass])
    assert torch.equal(back[0], big) and torch.equal(back[1], mass)
    # two ranks: the packed vectors add, and the halves of the sum decode to the exact int64 sum
    doubled = _unpack(_pack([big, mass]) * 2, [big, mass])
    assert doubled[0].tolist() == [2 * v for v in big.tolist()]


def test_without_distributed_a_synced_read_is_a_copy():
    c = Counts()
    c.hits.add_(torch.tensor([1, 0, 4]))
    out = c.synced(sync=True)
    out["hits"].add_(100)
    assert c.hits.tolist() == [1, 0, 4]
    assert all_reduce_sum([c.mass])[0].tolist() == [0.0, 0.0, 0.0]


def test_reset_keeps_the_tensors_and_to_moves_them():
    c = Counts()
    held = c.hits
    c.hits.add_(3)
    c.reset()
    assert c.hits is held and c.hits.tolist() == [0, 0, 0]
    c.to("cpu")
    assert c.device.type == "cpu" and c.state_names == ("hits", "mass")


def test_state_dict_round_trip_and_a_wrong_size_is_named():
    c, d = Counts(), Counts()
    c.hits.add_(torch.tensor([5, 6, 7]))
    c.mass.add_(0.5)
    d.load_state_dict({k: v.tolist() for k, v in c.state_dict().items()})
    assert d.hits.tolist() == [5, 6, 7] and d.mass.tolist() == [0.5] * 3
    with pytest.raises(ValueError, match="Expected 3 values for state 'hits', got 2"):
        d.load_state_dict({"hits": [1, 2]})
    with pytest.raises(TypeError, match="Expected a tensor default for state 'x', got int"):
        d.add_state("x", 0)


SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    from satmon.observe.states import SumStates
    from satmon.observe.counters import SaturationCounter

    rank = int(sys.argv[1]); out = sys.argv[2]
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"), rank=rank, world_size=2)
    c = SaturationCounter(3)
    c.update(torch.tensor([0, 2]), saturated=torch.tensor([2**52 + rank, 7 * rank]),
             total=torch.tensor([2**53 + 1, 100]))
    calls = []
    real = dist.all_reduce
    dist.all_reduce = lambda t, *a, **k: (calls.append(t.numel()), real(t, *a, **k))[1]
    s = c.synced(sync=True)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({k: v.tolist() for k, v in s.items()} | {"calls": calls, "local": c.total.tolist()}, f)
    dist.destroy_process_group()
    """
)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_two_processes_sum_in_one_collective_exactly(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), os.getcwd()) if p)}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path)], env=env) for r in range(2)]
    assert [p.wait(timeout=240) for p in procs] == [0, 0]
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["calls"] == [18]  # one all_reduce: 3 int64 states x 3 layers x 2 halves
        assert got["saturated"] == [2 * 2**52 + 1, 0, 7]  # beyond 2**53: exact
        assert got["total"] == [2 * (2**53 + 1), 0, 200]
        assert got["nonfinite"] == [0, 0, 0]
        assert got["local"] == [2**53 + 1, 0, 100]  # the read leaves each rank's own states alone
