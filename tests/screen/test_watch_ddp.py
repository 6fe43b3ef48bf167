"""2-process DDP (gloo, CPU): only one rank sees a breaching batch; both ranks stop at the same step.

The breach is a NaN training loss on rank 1 only, at step 5 (value NaN, gradient finite, so the
weights stay finite and the other rank sees nothing by itself). Each rank writes where it
stopped; the subprocess has a timeout, so a rank waiting for the other fails the test instead of
hanging it.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers import clean_env, run_ranks

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)

TESTS = Path(__file__).resolve().parents[1]  # tests/, where helpers.py lives
SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import torch
    import lightning.pytorch as pl
    from helpers import token_loader, trainer
    from satmon import SaturationMonitor
    from satmon.demos.lit import LitLM

    out = sys.argv[1]
    torch.set_num_threads(1)


    class OneRankBreach(LitLM):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            if self.global_rank == 1 and self.global_step == 5:
                loss = loss + (float("nan") - loss.detach())  # the value is NaN, the gradient is not
            return loss


    pl.seed_everything(0, verbose=False)
    lit = OneRankBreach(arch="gpt", d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=200.0, lr=1e-3, warmup=1)
    monitor = SaturationMonitor(window=2, abort_on="any", watch_every_n_steps=2, verbose=False)
    tr = trainer(out, devices=2, strategy="ddp", max_steps=30, callbacks=[monitor])
    tr.fit(lit, token_loader(n_batches=40, batch_size=2))
    with open(f"{{out}}/rank{{tr.global_rank}}.json", "w") as f:
        json.dump({{"global_step": tr.global_step, "stop": monitor.stop.to_dict() if monitor.stop else None,
                   "verdict": monitor.verdict.decision}}, f)
    torch.distributed.destroy_process_group()  # Lightning leaves a gloo group to the exit, where it can abort (-6)
    """
)


def test_one_rank_breach_stops_both_ranks_at_the_same_step(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    run_ranks([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=clean_env(), timeout=240)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["verdict"] == ranks[1]["verdict"] == "go"
    # NaN loss in optimizer step 5 on rank 1 only -> the per-step guard (a maximum over ranks) stops both ranks
    # at the end of that step, global step 6 (0.1 waited for the check after watched step 6: global step 7)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 6
    assert ranks[0]["stop"] == ranks[1]["stop"]
    assert ranks[0]["stop"]["reason"] == "nonfinite" and ranks[0]["stop"]["step"] == 6
