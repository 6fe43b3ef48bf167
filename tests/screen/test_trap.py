"""The trap watch against known answers: a hand-built model whose final DyT sits on a constant offset (tanh exactly
+-1, no gradient below it) is named trapped; the same model with an RMSNorm final norm is not; a model whose gated
layers saturate token by token is not; a Hugging Face LLaMA converted to DyT reads under bf16 as a float64
re-computation of the same pass does; the steps it does not check read nothing on the host; a resume keeps the
streak; satmon's own LLaMA demo, trapped, is named by step ~100 and its RMSNorm-final twin is not."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from satmon import DyT, Screen
from satmon.observe.trap import read_trap

V, C = 16, 8


class Toy(nn.Module):
    """emb -> x + mlp(DyT(x)) (the mlp's bias a constant offset) -> final norm -> head."""

    def __init__(self, final: str = "dyt", offset: float = 100.0, tied: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.block_norm = DyT(C, alpha_init=0.5)
        self.mlp = nn.Linear(C, C)
        with torch.no_grad():
            self.mlp.bias.fill_(offset)
        self.norm = DyT(C, alpha_init=0.2) if final == "dyt" else nn.RMSNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        x = x + self.mlp(self.block_norm(x))
        return self.head(self.norm(x))


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (4, 12), generator=g), torch.randint(0, V, (4, 12), generator=g)


def _train(model: nn.Module, screen: Screen, steps: int, lr: float = 1e-3) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for i in range(steps):
        x, y = _batch(i)
        loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        screen.step(loss)


def _reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor, norm: nn.Module, level: float = 2.0):
    """float64 re-computation of one pass: the final norm's input saturation and centered saturation, and the
    gradient norm of the parameters below it over the head side's (from ``.grad``)."""
    seen = {}
    h = norm.register_forward_hook(lambda m, a, o: seen.update(x=a[0].detach().to(torch.float64)))
    model.zero_grad()
    F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)).backward()
    h.remove()
    xf = seen["x"].reshape(-1, C)
    a = float(norm.alpha) if hasattr(norm, "alpha") else math.nan
    sat = ((a * xf).abs() > level).double().mean().item()
    cen = ((a * (xf - xf.mean(0))).abs() > level).double().mean().item()
    below = [model.emb.weight, *model.block_norm.parameters(), *model.mlp.parameters()]
    head = [*norm.parameters(), model.head.weight]
    sq = lambda ps: sum(p.grad.to(torch.float64).square().sum().item() for p in ps)
    return sat, cen, math.sqrt(sq(below) / sq(head))


def test_offset_saturated_final_dyt_with_no_gradient_below_is_named_trapped() -> None:
    torch.manual_seed(0)
    model = Toy("dyt")
    lines: list[str] = []
    screen = Screen(window=100, trap_every_n_steps=2, trap_patience=3, info=lines.append, warn=lambda s: None).attach(
        model
    )
    _train(model, screen, 7)  # checks at steps 1, 3, 5, 7: named at the third
    assert screen.trap is not None
    log = screen.trap.log
    assert [r["step"] for r in log] == [1, 3, 5, 7]
    assert [r["trapped"] for r in log] == [False, False, True, True]
    r = screen.trap.last
    assert r.final == "norm" and r.final_kind == "dyt" and r.reach == 0.0 and r.closed_step == 1
    assert set(r.reach_by_group) == {"emb", "block_norm", "mlp"} and all(v == 0.0 for v in r.reach_by_group.values())
    sat, cen, reach = _reference(model, *_batch(6), model.norm)
    assert sat == 1.0 and cen == 0.0 and reach == 0.0  # the known answer, by hand
    named = [line for line in lines if "trapped at step 5" in line]
    assert len(named) == 1 and "norm" in named[0] and "exactly 0" in named[0] and "final_norm=" in named[0]
    assert "trapped" in screen.card()
    assert screen.state_dict()["trap"]["named_step"] == [5]


def test_the_same_model_with_an_rmsnorm_final_norm_is_not_trapped() -> None:
    torch.manual_seed(0)
    model = Toy("rmsnorm")
    screen = Screen(window=100, trap_every_n_steps=2, trap_patience=3, info=lambda s: None, warn=lambda s: None).attach(
        model
    )
    _train(model, screen, 9)
    r = screen.trap.last
    assert r.final == "norm" and r.final_kind == "rmsnorm" and not r.found and not r.trapped
    assert r.reach > 0 and all(r["trapped"] is False for r in screen.trap.log)
    assert "not a DyT" in r.status() and screen.trap.state == "not trapped"


def test_the_reading_matches_a_float64_recomputation_of_the_pass() -> None:
    torch.manual_seed(1)
    for final, offset in (("dyt", 100.0), ("dyt", 0.0), ("rmsnorm", 0.0)):
        model = Toy(final, offset)
        x, y = _batch(3)
        r = read_trap(model, x, loss_fn=lambda out, b, y=y: F.cross_entropy(out.reshape(-1, V), y.reshape(-1)))
        sat, cen, reach = _reference(model, x, y, model.norm)
        assert r.reach == pytest.approx(reach, rel=1e-12, abs=0.0)
        if final == "dyt":
            assert r.layers["norm"]["saturated"] == sat and r.layers["norm"]["centered"] == cen
            assert r.found == (offset > 0)


def test_a_tied_head_counts_the_embedding_with_the_head() -> None:
    model = Toy("dyt", tied=True)
    x, y = _batch(0)
    r = read_trap(model, x, loss_fn=lambda out, b: F.cross_entropy(out.reshape(-1, V), y.reshape(-1)))
    assert "emb" not in r.reach_by_group and set(r.reach_by_group) == {"block_norm", "mlp"}
    assert r.reach == 0.0 and r.found  # the blocks get nothing; the embedding learns through the head only


def test_gated_layers_saturated_token_by_token_are_not_called_trapped() -> None:
    from satmon.demos.llama import LlamaLM

    torch.manual_seed(0)
    model = LlamaLM(vocab_size=V, d_model=16, n_layers=2, n_heads=2, seq_len=12, final_norm="dyt")
    with torch.no_grad():
        model.tok_emb.weight.normal_(0.0, 30.0)  # tokens far apart, no shared offset: saturation by token
    screen = Screen(window=100, trap_every_n_steps=1, trap_patience=1, info=lambda s: None, warn=lambda s: None).attach(
        model
    )
    _train(model, screen, 3, lr=1e-4)
    r = screen.trap.last
    gated = r.layers["blocks.1.mlp_norm"]
    assert gated["saturated"] > 0.5 and gated["centered"] / gated["saturated"] > 0.5  # saturated, not by an offset
    assert r.final == "norm_f" and not r.found and not any(c["trapped"] for c in screen.trap.log)


def test_hf_llama_converted_to_dyt_reads_under_bf16_as_the_float64_reference() -> None:
    transformers = pytest.importorskip("transformers")
    from satmon import convert_to_dyt

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    model = convert_to_dyt(transformers.LlamaForCausalLM(cfg), rmsnorm=True)
    with torch.no_grad():  # every token on one large offset: the final norm saturates by it
        model.model.embed_tokens.weight.normal_(0.0, 0.5).add_(60.0)
    norm = model.model.norm
    x = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(0))
    inputs: dict[str, torch.Tensor] = {}
    h = norm.register_forward_hook(lambda m, a, o: inputs.update(x=a[0].detach()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = read_trap(model, {"input_ids": x, "labels": x})
    h.remove()
    xf = inputs["x"].to(torch.float64).reshape(-1, 16)
    a = norm.alpha.detach().to(torch.float64)
    assert r.final == "model.norm" and r.final_kind == "dyt"
    assert r.layers["model.norm"]["saturated"] == ((a * xf).abs() > 2.0).double().mean().item()
    assert r.layers["model.norm"]["centered"] == ((a * (xf - xf.mean(0))).abs() > 2.0).double().mean().item()
    assert "model.embed_tokens" not in r.reach_by_group  # tied to the head: its gradient comes through it
    assert r.reach == 0.0 and r.found


class _NoHostRead:
    """Fails the test on any host read of a tensor (``.item()``, ``.tolist()``, ``bool()``, ``float()``, ``int()``,
    ``.cpu()``) inside the block."""

    NAMES = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu")

    def __enter__(self):
        self.saved = {n: getattr(torch.Tensor, n) for n in self.NAMES}
        for n in self.NAMES:
            setattr(torch.Tensor, n, self._fail(n))

    @staticmethod
    def _fail(name):
        def fail(*_a, **_k):
            raise AssertionError(f"host read Tensor.{name} on a step the trap watch does not check")

        return fail

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(torch.Tensor, n, f)


def test_steps_it_does_not_check_read_nothing_on_the_host() -> None:
    torch.manual_seed(0)
    model = Toy("dyt")
    every = 4
    # window 1 and no collapse watch: after step 1 the trap watch is the only satmon code that runs
    screen = Screen(
        window=1, trap_every_n_steps=every, watch_every_n_steps=0, info=lambda s: None, warn=lambda s: None
    ).attach(model, keep_inputs=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    checked = 0
    for step in range(1, 14):
        x, y = _batch(step)
        unchecked = (step - 1) % every != 0  # the trap reads steps 1, 5, 9, 13
        with _NoHostRead() if unchecked else _Null():
            loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            screen.step(loss)
        checked += not unchecked
    assert [r["step"] for r in screen.trap.log] == [1, 5, 9, 13] and checked == 4


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def test_a_resume_keeps_the_streak_and_what_was_named() -> None:
    torch.manual_seed(0)
    model = Toy("dyt")
    quiet = {"info": lambda s: None, "warn": lambda s: None}
    first = Screen(window=100, trap_every_n_steps=1, trap_patience=3, **quiet).attach(model)
    _train(model, first, 2)
    state = first.state_dict()
    assert state["trap"] == {"streak": [2], "closed_step": [1], "named_step": [-1]}
    second = Screen(window=100, trap_every_n_steps=1, trap_patience=3, **quiet)
    second.load_state_dict(state)
    second.attach(model, step=2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = _batch(9)
    loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    loss.backward()
    opt.step()
    second.end_step(3, loss)
    r = second.trap.last
    assert r.step == 3 and r.trapped and r.closed_step == 1 and r.streak == 3


@pytest.mark.parametrize("final", ["dyt", "rmsnorm"])
def test_satmon_llama_demo_trapped_is_named_by_step_100_and_its_rmsnorm_twin_is_not(final: str) -> None:
    from satmon.demos.corpus import corpus_tokens
    from satmon.demos.gpt import make_norm
    from satmon.demos.llama import LlamaLM

    torch.manual_seed(0)
    d, T, B, warm = 64, 64, 8, 20
    model = LlamaLM(d_model=d, n_layers=2, n_heads=4, seq_len=T, final_norm="dyt")  # the DyT paper's layout
    if final == "rmsnorm":  # the final norm alone swapped: every block norm stays DyT
        model.norm_f = make_norm("rmsnorm", d, 1.0, bias=False)
    toks = corpus_tokens(200_000)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    # the window's own counts off the hot path (sampled, no offset statistics): the trap watch is what is tested
    screen = Screen(
        window=1000, sample_every=100, offset_every=0, watch_every_n_steps=0, info=lambda s: None, warn=lambda s: None
    ).attach(model, keep_inputs=False)
    g = torch.Generator().manual_seed(0)
    for _ in range(101):
        ix = torch.randint(0, len(toks) - T - 1, (B,), generator=g)
        x = torch.stack([toks[i : i + T] for i in ix]).long()
        y = torch.stack([toks[i + 1 : i + T + 1] for i in ix]).long()
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        screen.step(loss)
    named = [r["step"] for r in screen.trap.log if r["trapped"]]
    if final == "dyt":
        assert named and named[0] <= 101 and screen.trap.last.final == "norm_f"
    else:
        assert not named and screen.trap.last.final_kind == "rmsnorm" and screen.trap.last.reach > 1e-3


def test_the_lightning_callback_reads_the_trap_through_the_same_screen(tmp_path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from helpers import trainer
    from satmon import SaturationMonitor
    from satmon.io.tags import TAG

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Toy("dyt")

        def training_step(self, batch, _i):
            x, y = batch
            return F.cross_entropy(self.net(x).reshape(-1, V), y.reshape(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class Sink:
        def __init__(self) -> None:
            self.scalars_seen: dict[str, list[tuple[int, float]]] = {}
            self.texts: list[tuple[str, int]] = []
            self.params: list[dict] = []

        def scalars(self, values, step):
            for k, v in values.items():
                self.scalars_seen.setdefault(k, []).append((step, v))

        def text(self, tag, markdown, step):
            self.texts.append((tag, step))
            return ["test sink"]

        def hparams(self, params, metrics, step):
            self.params.append(dict(params))

        def close(self):
            pass

    torch.manual_seed(0)
    sink = Sink()
    data = [_batch(i) for i in range(8)]
    monitor = SaturationMonitor(window=6, trap_every_n_steps=2, trap_patience=2, sink=sink, verbose=False)
    trainer(tmp_path, max_steps=8, callbacks=[monitor]).fit(Lit(), torch.utils.data.DataLoader(data, batch_size=None))
    assert sink.scalars_seen[TAG.trap][0] == (1, 0.0)  # from step 1
    assert next(s for s, v in sink.scalars_seen[TAG.trap] if v == 1.0) == 3
    assert (TAG.trap_text, 3) in sink.texts and sink.params and sink.params[0][TAG.hp_trap] == "trapped"
    assert any("trapped at step 3" in n for n in monitor.verdict.notes)


def test_gradient_accumulation_reads_the_order_of_one_forward_and_the_steps_gradient() -> None:
    """Two micro-batches per optimizer step through a submodule (as a LightningModule's training step calls its
    network): the order is the first forward's, the reach the accumulated gradient's."""
    torch.manual_seed(0)
    outer = nn.ModuleDict({"net": Toy("rmsnorm")})  # attached to the container; the loop calls the submodule
    screen = Screen(window=100, trap_every_n_steps=1, info=lambda s: None, warn=lambda s: None).attach(outer)
    opt = torch.optim.SGD(outer.parameters(), lr=1e-3)
    opt.zero_grad()
    for k in range(2):
        x, y = _batch(k)
        (F.cross_entropy(outer["net"](x).reshape(-1, V), y.reshape(-1)) / 2).backward()
    net = outer["net"]
    below = [net.emb.weight, *net.block_norm.parameters(), *net.mlp.parameters()]
    head = [*net.norm.parameters(), net.head.weight]
    sq = lambda ps: sum(p.grad.to(torch.float64).square().sum().item() for p in ps)
    want = math.sqrt(sq(below) / sq(head))
    opt.step()
    screen.step(torch.tensor(1.0))
    r = screen.trap.last
    assert r.final == "net.norm" and set(r.reach_by_group) == {"net.emb", "net.block_norm", "net.mlp"} and not r.unknown
    assert r.reach == pytest.approx(want, rel=1e-12)
