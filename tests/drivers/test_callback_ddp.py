"""DDP with 2 CPU processes (gloo) gives the same counts and verdict as one process on the same global data.

The DDP run is one script in a subprocess (``strategy="ddp"``: Lightning starts the second rank itself
by re-running the script) that fits once per learning rate in the same process group (one launch for
every check here), with a ``timeout`` so that a stuck rendezvous fails the test instead of hanging it,
and that must exit 0 on both ranks (``helpers.run_ranks``); the one-process baseline runs the same
script inside pytest. Every rank writes, per fit, its local counts, its own float64 reference counts,
the monitor's ``state_dict()`` (summed over ranks) and the verdict to a JSON file.

Same global data: 2 ranks x batch 4 with a ``DistributedSampler(shuffle=False)`` give rank ``r`` the
samples ``8k + r, 8k + r + 2, ...`` at step ``k``; their union is exactly the single process's batch
``k`` of size 8 over the same tensor. The sampler is ours (``use_distributed_sampler=False``):
the one Lightning injects for training always shuffles, whatever the DataLoader says.

Exact or approximate. Counts only add up, so they agree exactly as long as the weights agree. DDP
averages the two ranks' mean-loss gradients, one process takes the mean over the global batch: the
same number up to float rounding, so from the first optimizer step on the weights (and the few
elements that sit within rounding of ``|alpha x| = level``) may differ. Hence two comparisons:
``lr=0`` (weights never move, every step of a multi-step window is exact: integer equality of
every layer's counts and identical verdicts) and a real learning rate, where counts must agree to
a small tolerance and the decision must be the same.
"""

from __future__ import annotations

import json
import runpy
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import clean_env, run_ranks

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)

TESTS = Path(__file__).resolve().parents[1]  # tests/, where helpers.py lives
WINDOW = 4
SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import DataLoader, DistributedSampler
    from helpers import tiny_lit, token_loader, trainer
    from reference import InputRecorder, counts_of
    from satmon import SaturationMonitor
    from satmon import find_dyt_layers

    devices, batch_size, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4]
    lrs = [float(v) for v in sys.argv[3].split(",")]
    torch.set_num_threads(1)


    class StateProbe(Callback):
        # state_dict() all-reduces the counts: call it while the process group is surely alive.
        def __init__(self, monitor):
            self.monitor, self.state = monitor, None

        def on_train_end(self, trainer, pl_module):
            self.state = self.monitor.state_dict()


    class Data(pl.LightningDataModule):
        # 8 samples per optimizer step in total, {window} + 2 steps; the sampler needs the rank, known at fit.
        def __init__(self, batch_size):
            super().__init__()
            self.batch_size = batch_size

        def train_dataloader(self):
            data = token_loader(n_batches=({window} + 2) * 8 // self.batch_size, batch_size=self.batch_size).dataset
            t = self.trainer
            sampler = None
            if t.world_size > 1:
                sampler = DistributedSampler(data, num_replicas=t.world_size, rank=t.global_rank, shuffle=False)
            return DataLoader(data, batch_size=self.batch_size, sampler=sampler, shuffle=False)


    def fit(lr):
        # one fit: a fresh model, monitor and Trainer (the second Trainer joins the process group the first made)
        pl.seed_everything(0, verbose=False)
        lit = tiny_lit(alpha_init=50.0, lr=lr)
        names = [l.name for l in find_dyt_layers(lit)]
        rec = InputRecorder(lit, names)
        monitor = SaturationMonitor(window={window}, verbose=False)
        probe = StateProbe(monitor)
        kw = dict(strategy="ddp", num_nodes=1) if devices > 1 else {{}}
        tr = trainer(f"{{out}}/lr{{lr}}", devices=devices, max_steps={window} + 2, callbacks=[monitor, probe],
                     use_distributed_sampler=False, **kw)
        tr.fit(lit, datamodule=Data(batch_size))
        result = dict(
            world_size=tr.world_size, rank=tr.global_rank, layers=monitor.layer_names,
            saturated=monitor.screen.hooks.counter.saturated.tolist(),
            total=monitor.screen.hooks.counter.total.tolist(),
            reference=rec.counts(first={window}), forwards=len(rec.inputs[names[0]]),
            state=probe.state, verdict=monitor.verdict.to_dict(),
            per_step=[counts_of(rec.inputs[n][i] for n in names)[0] for i in range({window})],
            first_tokens=[x[:, 0, 0].tolist() for x, _ in rec.inputs[names[0]]],  # one number per sample and step
        )
        rec.remove()
        with open(f"{{out}}/result-lr{{lr}}-{{tr.global_rank}}.json", "w") as f:
            json.dump(result, f)


    for lr in lrs:
        fit(lr)
    # Lightning destroys its process group at exit only for NCCL; a gloo group left to the interpreter's exit can end
    # the process by std::terminate (exit -6): a script that made one ends it (docs/reference/distributed.md)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    """
)


LRS = (0.0, 3e-3)  # weights that never move (exact), and a real learning rate (to a tolerance)


def _run(tmp_path: Path, devices: int) -> dict[float, list[dict]]:
    """Run the script, one fit per learning rate; one process runs inside pytest (saves an interpreter and a Lightning
    import), two in one launch. Per learning rate, the ranks' results in rank order."""
    out = tmp_path / f"ddp{devices}"
    out.mkdir()
    script = out / "run.py"
    script.write_text(SCRIPT.format(tests=str(TESTS), window=WINDOW))
    argv = [str(script), str(devices), str(8 // devices), ",".join(str(lr) for lr in LRS), str(out)]
    if devices == 1:
        threads = torch.get_num_threads()  # the script sets 1 thread, as each DDP rank gets on 2 cores
        try:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(sys, "argv", argv)
                mp.setenv("PL_GLOBAL_SEED", "0")  # seed_everything writes it; restore afterwards
                runpy.run_path(str(script), run_name="__main__")
        finally:
            torch.set_num_threads(threads)
    else:
        env = {**clean_env(), "MASTER_ADDR": "127.0.0.1"}
        run_ranks([sys.executable, *argv], cwd=str(out), env=env, timeout=240)
    runs = {}
    for lr in LRS:
        results = [json.loads((out / f"result-lr{lr}-{r}.json").read_text()) for r in range(devices)]
        assert [r["rank"] for r in results] == list(range(devices))
        assert all(r["world_size"] == devices for r in results)
        runs[lr] = results
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    return {(devices, lr): results for devices in (1, 2) for lr, results in _run(tmp, devices).items()}


def _global(results: list[dict], key: str) -> list[int]:
    return [sum(vals) for vals in zip(*(r[key] for r in results))]


@pytest.mark.parametrize("lr", [0.0, 3e-3])
def test_each_rank_counts_its_own_data_exactly(runs, lr):
    for r in runs[(2, lr)] + runs[(1, lr)]:
        assert r["forwards"] == WINDOW + 2  # all training forwards; the window counted the first WINDOW
        assert r["saturated"] == [r["reference"][n][0] for n in r["layers"]]
        assert r["total"] == [r["reference"][n][1] for n in r["layers"]]
    ddp = runs[(2, lr)]
    assert ddp[0]["total"] == ddp[1]["total"] == [WINDOW * 4 * 16 * 32] * len(ddp[0]["layers"])
    assert ddp[0]["saturated"] != ddp[1]["saturated"]  # the ranks really saw different samples


def test_ddp_equals_one_process_exactly_when_weights_are_equal(runs):
    single, ddp = runs[(1, 0.0)][0], runs[(2, 0.0)]
    assert ddp[0]["layers"] == single["layers"]
    # Same global data, step by step: the single batch interleaves rank 0's and rank 1's samples
    # (the first DyT input is the embedding of each sample: one exact number per sample).
    for step, whole in enumerate(single["first_tokens"]):
        assert whole[0::2] == ddp[0]["first_tokens"][step] and whole[1::2] == ddp[1]["first_tokens"][step]
    assert _global(ddp, "saturated") == single["saturated"]
    assert _global(ddp, "total") == single["total"]
    for r in ddp:
        # decision, pooled and per-layer fractions, elements, step: exact; the window's loss trend is the mean of
        # the ranks' losses, equal to the one-process loss up to float rounding
        # the ranks' losses, equal to the one-process loss up to float rounding; the offset statistics centre each
        # rank's own batch (half the tokens), so only their plain sampled saturation is the same number
        assert {**r["verdict"], "loss": None, "offset": None} == {**single["verdict"], "loss": None, "offset": None}
        assert r["verdict"]["loss"]["first"] == pytest.approx(single["verdict"]["loss"]["first"], rel=1e-6)
        for name, got in r["verdict"]["offset"].items():
            assert got["saturated"] == single["verdict"]["offset"][name]["saturated"]
        # state_dict() keeps the counts summed over ranks (what a resume needs whatever the world size).
        assert r["state"]["saturated"] == single["saturated"] and r["state"]["total"] == single["total"]
        assert r["state"]["steps_seen"] == WINDOW
    v = single["verdict"]
    assert v["step"] == WINDOW and v["elements"] == sum(single["total"])
    assert v["saturation"] == sum(single["saturated"]) / sum(single["total"])
    assert 0.05 < v["saturation"] < 0.95


def test_ddp_matches_one_process_while_training(runs):
    single, ddp = runs[(1, 3e-3)][0], runs[(2, 3e-3)]
    assert _global(ddp, "total") == single["total"]
    # The first step's forward runs on identical weights in both set-ups: its counts are exact.
    assert ddp[0]["per_step"][0] + ddp[1]["per_step"][0] == single["per_step"][0]
    for r in ddp:
        assert r["verdict"]["decision"] == single["verdict"]["decision"]
        assert r["verdict"]["saturation"] == pytest.approx(single["verdict"]["saturation"], abs=1e-3)
        for name, frac in single["verdict"]["per_layer"].items():
            assert r["verdict"]["per_layer"][name] == pytest.approx(frac, abs=2e-3)
        assert r["verdict"] == ddp[0]["verdict"]  # every rank holds the same (reduced) verdict
    sat_ddp, sat_single = _global(ddp, "saturated"), single["saturated"]
    assert all(abs(a - b) <= 0.001 * t for a, b, t in zip(sat_ddp, sat_single, single["total"]))
    # the weights moved: the lr=0 run saw different activations after step 1
    assert sat_single != runs[(1, 0.0)][0]["saturated"]
