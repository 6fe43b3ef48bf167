"""Distributed faults: no satmon collective is entered by one rank and not the others.

Two CPU ranks (gloo) whose dataloaders yield different numbers of batches (5 and 4), with training
ending before the screening window closes. Without satmon Lightning's run ends on its own (it
fails: one rank waits for a gradient all-reduce the other never starts, until gloo gives up); with
satmon 0.1 it hung until killed, because satmon's end-of-training count sync waited while the
other rank waited in Lightning's per-step collectives. The test runs both under a timeout and
requires satmon's run to end no later than a generous bound over the baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")

TESTS = Path(__file__).resolve().parent
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import torch
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, Subset
    from helpers import tiny_lit, token_loader, trainer
    from satmon import SaturationMonitor

    with_satmon, out = sys.argv[1] == "1", sys.argv[2]
    torch.set_num_threads(1)


    class Uneven(pl.LightningDataModule):
        # rank 0 gets 5 batches, rank 1 gets 4: a custom split Lightning does not pad
        def train_dataloader(self):
            data = token_loader(n_batches=9, batch_size=2).dataset
            rank = self.trainer.global_rank
            idx = range(0, 10) if rank == 0 else range(10, 18)
            return DataLoader(Subset(data, list(idx)), batch_size=2, shuffle=False)


    monitor = SaturationMonitor(window=50, verbose=False)
    callbacks = [monitor] if with_satmon else []
    tr = trainer(out, devices=2, strategy="ddp", num_nodes=1, max_epochs=1, callbacks=callbacks,
                 use_distributed_sampler=False)
    try:
        tr.fit(tiny_lit(alpha_init=2.0), datamodule=Uneven())
        status = "finished"
    except Exception as e:  # what Lightning/gloo raise is theirs; satmon must not turn it into a hang
        status = "error: " + type(e).__name__
    verdict = monitor.verdict.to_dict() if with_satmon and monitor.verdict else None
    with open(os.path.join(out, f"rank-{{tr.global_rank}}.json"), "w") as f:
        json.dump(dict(status=status, verdict=verdict, steps=tr.global_step), f)
    """
)


def _run(tmp_path: Path, with_satmon: bool, timeout: float) -> tuple[float, bool]:
    out = tmp_path / ("satmon" if with_satmon else "baseline")
    out.mkdir()
    script = out / "run.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "TORCH_GLOO_TIMEOUT": "30"}
    for var in ("MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "PL_GLOBAL_SEED"):
        env.pop(var, None)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script), "1" if with_satmon else "0", str(out)], cwd=str(out), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
        return time.monotonic() - start, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return time.monotonic() - start, True


def test_uneven_batches_do_not_hang_with_satmon(tmp_path):
    baseline, baseline_hung = _run(tmp_path, with_satmon=False, timeout=150)
    assert not baseline_hung, "the run without satmon did not end: the scenario itself hangs on this machine"
    took, hung = _run(tmp_path, with_satmon=True, timeout=max(90.0, 3 * baseline))
    assert not hung, f"satmon's run hung (killed after {took:.0f} s; without satmon it ended in {baseline:.0f} s)"
