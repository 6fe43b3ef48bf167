"""satmon.screen.agreement: ``TorchDistributed`` on one process, and on two gloo processes where only one rank
holds the flag (the answer must be the same on both ranks: it decides whether both stop)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from helpers import clean_env
from satmon.screen.agreement import Agreement, TorchDistributed


def test_one_process_is_its_own_agreement():
    a = TorchDistributed()
    assert isinstance(a, Agreement)  # the Protocol a driver implements (Lightning's strategy, Fabric, ...)
    assert (a.rank, a.world_size) == (0, 1)
    assert a.any(True) is True and a.any(False) is False
    values = torch.tensor([0.5, -1.0], dtype=torch.float64)
    assert torch.equal(a.max(values), values)


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from satmon.screen.agreement import TorchDistributed

    def run(rank, out, init):
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
        a = TorchDistributed()
        got = {
            "rank": a.rank, "world_size": a.world_size,
            "any_one": a.any(rank == 1),            # only rank 1 holds the flag
            "any_none": a.any(False),
            "max": a.max(torch.tensor([float(rank), 5.0 - rank, -1.0], dtype=torch.float64)).tolist(),
        }
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(got, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        out = sys.argv[1]
        mp.spawn(run, args=(out, f"file://{out}/store"), nprocs=2, join=True)
    """
)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_two_ranks_get_the_same_answer(tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=clean_env(), capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, got in enumerate(ranks):
        assert got == {"rank": r, "world_size": 2, "any_one": True, "any_none": False, "max": [1.0, 5.0, -1.0]}
