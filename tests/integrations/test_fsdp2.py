"""``satmon.Screen`` and ``satmon.probe`` under FSDP2
(``torch.distributed.fsdp.fully_shard``), two CPU processes (gloo).

Outside the forward an FSDP2 module's parameters are sharded ``DTensor``s (a 1-element ``alpha`` sits whole
on rank 0, empty on rank 1); inside it they are whole, in storage FSDP2 re-gathers every forward. Each
rank trains on the same batches as the unsharded reference, so FSDP2's averaged gradient is the
reference's exactly and every count can be compared exactly, at a real learning rate: the saturation
and every layer's fraction equal the unsharded run's, with twice its elements (two ranks); both ranks
reach the same verdict and stop at the same step; the probe reads the whole gammas and the same alignments.

The sharded run is a script in a subprocess (``torch.multiprocessing.spawn``) with a timeout, so a stuck
collective fails the test instead of hanging it; the unsharded reference runs inside pytest.
"""

from __future__ import annotations

import json
import socket
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

import satmon  # noqa: E402
from satmon.model.affine import effective_affine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WINDOW, STEPS = 4, 6

COMMON = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    import satmon
    from satmon.demos.gpt import GPT, GPTConfig

    WINDOW, STEPS = {window}, {steps}
    SETTINGS = dict(window=WINDOW, verbose=False, abort_on="any", threshold=0.9)  # NO-GO at the window: a stop


    def dyt_model():
        torch.manual_seed(0)
        return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=8.0))


    def layernorm_model():
        torch.manual_seed(0)
        model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, norm="layernorm"))
        with torch.no_grad():  # gammas far from 1 and from each other: a shard or a default would show
            for name, p in model.named_parameters():
                if ".ln_" in name or name.startswith("ln_f"):
                    p.uniform_(0.5, 2.0) if name.endswith("weight") else p.uniform_(-0.1, 0.1)
        return model


    def batches():
        g = torch.Generator().manual_seed(1)
        return [torch.randint(0, 256, (4, 17), generator=g) for _ in range(STEPS)]


    def train(model, screen):
        # returns the steps run and the saturation a probe read between steps 2 and 3 (not counted by the screen)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
        steps, probed = 0, None
        for b in batches():
            loss = F.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            if steps == 2:
                with screen.paused():
                    probed = satmon.probe(model, b[:, :-1]).saturation
            if screen.step(loss):
                break
        screen.finish()
        screen.detach()
        return steps, probed


    def probe_readings(report):
        return {{"alignment": {{n: l.alignment for n, l in report.layers.items()}},
                 "null_dim": {{n: l.null_dim for n, l in report.layers.items()}},
                 "sigma_min": report.sigma_min.to_dict() if hasattr(report.sigma_min, "to_dict") else None}}
    """
)

SHARDED = COMMON + textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from satmon.model.affine import effective_affine


    def shard(model):
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model


    def worker(rank, port, out):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = shard(dyt_model())
        alpha = model.blocks[0].ln_1.alpha
        record = {{"rank": rank, "alpha_type": type(alpha).__name__, "alpha_local": alpha.to_local().numel()}}
        screen = satmon.Screen(**SETTINGS).attach(model, example_input=batches()[0][:, :-1])
        record["steps"], record["probed"] = train(model, screen)
        record["verdict"] = screen.verdict.to_dict()
        record["stop"] = screen.stop.to_dict() if screen.stop else None
        record["state"] = screen.state_dict()  # a collective: the counts summed, the alphas gathered whole

        ln = shard(layernorm_model())
        record["weight_type"] = type(ln.blocks[0].ln_1.weight).__name__
        record["gains"] = {{n: effective_affine(m).gain.tolist()
                           for n, m in ln.named_modules() if isinstance(m, torch.nn.LayerNorm)}}
        record["probe"] = probe_readings(satmon.probe(ln, [b[:, :-1] for b in batches()[:2]]))
        with open(os.path.join(out, f"rank{{rank}}.json"), "w") as f:
            json.dump(record, f)
        dist.barrier()  # every rank done with the group before any ends it (docs/reference/distributed.md)
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(worker, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("fsdp2")
    script = tmp / "fsdp2_run.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n" + SHARDED.format(window=WINDOW, steps=STEPS))
    run_ranks([sys.executable, str(script), str(_free_port()), str(tmp)], cwd=tmp, env=clean_env(), timeout=240)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def reference() -> dict:
    """The unsharded run and probe, in this process, from the same definitions."""
    ns: dict = {}
    exec(COMMON.format(window=WINDOW, steps=STEPS), ns)
    model = ns["dyt_model"]()
    screen = satmon.Screen(**ns["SETTINGS"]).attach(model, example_input=ns["batches"]()[0][:, :-1])
    steps, probed = ns["train"](model, screen)
    ln = ns["layernorm_model"]()
    return {
        "steps": steps,
        "probed": probed,
        "verdict": screen.verdict,
        "stop": screen.stop,
        "ln": ln,
        "probe": ns["probe_readings"](satmon.probe(ln, [b[:, :-1] for b in ns["batches"]()[:2]])),
    }


def test_the_parameters_are_sharded_outside_the_forward(ranks):
    assert [r["alpha_type"] for r in ranks] == ["DTensor", "DTensor"] and [r["weight_type"] for r in ranks] == [
        "DTensor"
    ] * 2
    assert [r["alpha_local"] for r in ranks] == [1, 0]  # the 1-element alpha: whole on rank 0, an empty shard on rank 1


def test_counts_equal_the_unsharded_run(ranks, reference):
    v, ref = ranks[0]["verdict"], reference["verdict"]
    assert v["per_layer"] == ref.per_layer and v["saturation"] == ref.saturation  # exact: same data on both ranks
    assert v["elements"] == 2 * ref.elements and v["decision"] == ref.decision == "no-go"
    state = ranks[0]["state"]
    assert [s / t for s, t in zip(state["saturated"], state["total"])] == list(ref.per_layer.values())


def test_a_probe_between_steps_reads_and_changes_nothing(ranks, reference):
    # the probe's no-grad forward would leave FSDP2's root unsharded and the next step on stale parameters;
    # the counts above (after the probe) equal the reference's only because satmon reshards afterwards
    assert ranks[0]["probed"] == ranks[1]["probed"] == reference["probed"] is not None


def test_both_ranks_agree_on_the_verdict_and_the_stop(ranks, reference):
    assert ranks[0]["verdict"] == ranks[1]["verdict"]
    assert ranks[0]["stop"] == ranks[1]["stop"] == reference["stop"].to_dict()
    assert ranks[0]["steps"] == ranks[1]["steps"] == reference["steps"] == WINDOW < STEPS
    assert ranks[0]["state"] == ranks[1]["state"]


def test_the_probe_reads_whole_gammas(ranks, reference):
    expected = {
        n: effective_affine(m).gain.tolist()
        for n, m in reference["ln"].named_modules()
        if isinstance(m, torch.nn.LayerNorm)
    }
    assert all(len(g) == 32 for g in expected.values())
    for r in ranks:
        assert r["gains"] == expected
        assert r["probe"] == reference["probe"]
    assert all(a is not None and a > 0.999 for a in reference["probe"]["alignment"].values())
