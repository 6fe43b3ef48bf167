"""One reading pipeline: the same batches through the live window (Screen) and through probe() give the same
reading (saturation counts, offset statistics, gate statistics) and the same flags, and both equal an
independent float64 computation written here from the definitions (docs/science/science.md), not from satmon's code.

The models have no dropout and no optimizer step runs, so a training forward and a probe's eval forward
see the same inputs. The offset-driven case is the issue's: a DyT input that is a per-channel constant
(+-3) with a token spread of 0.1 (0.2 read it GO with no flag through probe and replay).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import satmon
from satmon import DyT
from satmon.demos.llama import LlamaLM

C = 16
# docs/science/science.md: offset-driven when less than a quarter of the saturation survives centering
RETAINED_BELOW = 0.25


class Offset(nn.Module):
    """One DyT whose input sits on +-3 per channel with spread 0.1 (offset-driven), one fed by the tokens."""

    def __init__(self, offset: float = 3.0, spread: float = 0.1) -> None:
        super().__init__()
        sign = torch.where(torch.arange(C) % 2 == 0, 1.0, -1.0)
        self.register_buffer("offset", offset * sign)
        self.spread = spread
        self.a = DyT(C, alpha_init=1.0)
        self.mix = nn.Linear(C, C)
        self.b = DyT(C, alpha_init=2.0)

    def forward(self, x):  # (B, T, C)
        h = self.a(self.offset + self.spread * x)  # (B, T, C): each channel a constant, plus a little noise
        return self.b(0.5 * x + 0.1 * self.mix(h))  # token-varying, little saturated


class Recorder:
    """Every DyT input of every forward, in float64, and its alpha (independent of satmon's hooks)."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        modules = dict(model.named_modules())
        self.inputs: dict[str, list[tuple[np.ndarray, float]]] = {n: [] for n in names}
        self.handles = [modules[n].register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str):
        def hook(mod, args, out):
            x = args[0].detach().to(torch.float64).reshape(-1, args[0].shape[-1]).numpy().copy()
            self.inputs[name].append((x, float(mod.alpha.detach().to(torch.float64).abs().item())))

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def reference(self, level: float = 2.0) -> tuple[dict, dict, bool]:
        """Counts, offset readings and the offset-driven flag, from the definitions, in float64."""
        counts, offset = {}, {}
        for name, items in self.inputs.items():
            sat = total = cen = 0
            medians = []
            for x, a in items:  # one batch: its tokens are the rows
                m = x.mean(axis=0)
                dev = x - m
                spread = np.sqrt((dev**2).mean(axis=0))
                sat += int((np.abs(a * x) > level).sum())
                cen += int((np.abs(a * dev) > level).sum())
                total += x.size
                ratio = np.where(np.abs(m) == 0, 0.0, np.abs(m) / spread)
                medians.append(min(float(np.median(ratio)), 1e12))
            counts[name] = (sat, total)
            offset[name] = {"saturated": sat / total, "centered": cen / total, "offset_ratio": float(np.mean(medians))}
        pooled_sat = sum(r["saturated"] for r in offset.values())
        pooled_cen = sum(r["centered"] for r in offset.values())
        return counts, offset, pooled_sat > 0 and pooled_cen / pooled_sat < RETAINED_BELOW


def _batches(n: int = 4, shape=(4, 32, C), seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


def _through_screen(model: nn.Module, batches, record: list[str] | None = None, **options):
    """The window over ``batches``; with ``record``, also a Recorder of its training forwards (after the
    gating trace that ``attach`` runs on the first batch)."""
    model.train()
    screen = satmon.Screen(window=len(batches), offset_every=1, verbose=False, **options)
    screen.attach(model, example_input=batches[0])
    rec = Recorder(model, record) if record else None
    for b in batches:
        model(b)
        screen.step()  # no optimizer step: the weights the probe reads are the same
    screen.detach()
    assert screen.verdict is not None
    if rec is not None:
        rec.remove()
        return screen, rec
    return screen


@pytest.mark.parametrize(("offset", "flagged"), [(3.0, True), (0.0, False)])
def test_screen_and_probe_give_one_reading_equal_to_float64(offset, flagged):
    torch.manual_seed(0)
    model, batches = Offset(offset=offset, spread=0.1 if offset else 2.0), _batches()
    names = ["a", "b"]
    screen, rec = _through_screen(model, batches, record=names)
    seen = Recorder(model, names)
    report = satmon.probe(model, batches)
    seen.remove()
    # the probe's forwards (after its own gating trace) saw exactly the window's inputs (no dropout, no step)
    for n in names:
        assert len(rec.inputs[n]) == len(batches)
        assert all(np.array_equal(x, y) for (x, _), (y, _) in zip(rec.inputs[n], seen.inputs[n][-len(batches) :]))
    counts, offset_ref, flag_ref = rec.reference()
    live, ckpt = screen.reading, report.reading
    for r in (live, ckpt):
        assert {n: (c.saturated, c.total) for n, c in r.counts.items()} == counts
        for n in names:
            for key in ("saturated", "centered", "offset_ratio"):
                assert r.offset[n][key] == pytest.approx(offset_ref[n][key], rel=1e-12, abs=1e-15), (n, key)
        assert r.offset_driven is flag_ref is flagged
    # one reading: the same counts and offsets, bit for bit; they differ only in where they came from
    assert live.counts == ckpt.counts and live.offset == ckpt.offset and live.alphas == ckpt.alphas
    assert (live.source, live.window, ckpt.source, ckpt.window) == ("window", 4, "probe", 0)
    v_live, v_ckpt = screen.verdict, report.verdict
    assert v_live.flags == v_ckpt.flags == (("offset-driven",) if flagged else ())
    assert v_live.per_layer == v_ckpt.per_layer and v_live.offset == v_ckpt.offset
    assert v_live.decision == v_ckpt.decision and v_live.trust == v_ckpt.trust == (
        "flagged" if flagged else v_live.trust
    )


def test_the_offset_driven_probe_is_flagged_through_replay_too(tmp_path):
    from satmon.replaying.checkpoints import inspect_checkpoint
    from satmon.replaying.loop import ModelLoader, checkpoint_records

    torch.manual_seed(0)
    model = Offset()
    torch.save(model.state_dict(), tmp_path / "w.pt")
    (record,) = checkpoint_records(
        [inspect_checkpoint(tmp_path / "w.pt")], ModelLoader(factory=Offset), _batches(), twin=False
    )
    v = record.verdict
    assert v.source == "replay" and v.decision == "go" and v.flags == ("offset-driven",) and v.trust == "flagged"
    assert "flagged (offset-driven): a measurement, not a forecast" in v.headline() and set(v.offset) == {"a", "b"}
    assert record.to_dict()["verdict"]["trust"] == "flagged"  # what --json writes


def test_gate_statistics_are_one_reading_too():
    torch.manual_seed(0)
    model = LlamaLM(vocab_size=32, d_model=16, n_layers=1, n_heads=2, seq_len=8)
    batches = [torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    screen = _through_screen(model, batches)
    report = satmon.probe(model, batches)
    assert screen.reading.gate and screen.reading.gate == report.reading.gate
    assert screen.verdict.risk == report.verdict.risk and report.verdict.gated
    # the gate statistics against the definition: the share of SiLU gate pre-activations in the flat tail (< -4.08)
    gates = []
    mlp = model.blocks[0].mlp
    h = mlp.gate_proj.register_forward_hook(lambda m, a, out: gates.append(out.detach().to(torch.float64)))
    model.eval()
    with torch.no_grad():
        for b in batches:
            model(b)
    h.remove()
    g = torch.cat([x.reshape(-1) for x in gates])
    ((_, stats),) = report.reading.gate.items()
    assert stats["flat_fraction"] == pytest.approx(float((g < -4.08).double().mean()), abs=1e-12)


def test_nan_in_the_output_head_after_the_dyt_layers_reads_nonfinite_in_probe_and_window():
    torch.manual_seed(0)
    model, batches = Offset(offset=0.0, spread=2.0), _batches()
    head = nn.Linear(C, 4)
    with torch.no_grad():
        head.weight[0, 0] = float("nan")
    whole = nn.Sequential(model, head)  # the NaN sits after every DyT layer: their inputs stay finite
    report = satmon.probe(whole, batches)
    v = report.verdict
    assert v.nonfinite == 0 and v.nonfinite_weights == 1 and v.decision == "non-finite"
    assert "1.weight (1)" in v.reason and v.headline().startswith("NON-FINITE")
    screen = _through_screen(whole, batches)
    assert screen.verdict.decision == "non-finite" and screen.verdict.nonfinite_weights == 1
    assert dict(screen.reading.nonfinite_weights) == {"1.weight": 1}


def test_a_layer_the_hooks_refuse_is_a_note_on_both_paths():
    class ReshapingDyT(nn.Module):  # a per-channel alpha reshaped in the forward: invisible to the hook
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.alpha = nn.Parameter(torch.full((channels,), 2.0))
            self.weight = nn.Parameter(torch.ones(channels))
            self.bias = nn.Parameter(torch.zeros(channels))

        def forward(self, x):  # (B, C, H, W)
            c = (-1, 1, 1)
            return self.weight.view(c) * torch.tanh(self.alpha.view(c) * x) + self.bias.view(c)

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv_norm, self.norm = ReshapingDyT(4), DyT(6, alpha_init=1.3)

        def forward(self, x):  # (B, 4, 5, 6)
            return self.norm(self.conv_norm(x))

    model, batches = Mixed(), [torch.randn(2, 4, 5, 6) * 2 for _ in range(2)]
    with pytest.warns(RuntimeWarning, match="not counted"):
        screen = _through_screen(model, batches)
    with pytest.warns(RuntimeWarning, match="not counted"):
        report = satmon.probe(model, batches)
    for v in (screen.verdict, report.verdict):
        assert [n for n in v.notes if n.startswith("layer conv_norm not counted")] and list(v.per_layer) == ["norm"]
