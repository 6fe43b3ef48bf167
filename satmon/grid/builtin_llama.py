"""``satmon grid llama``: a second family as a built-in recipe, :class:`satmon.demos.llama.LlamaLM` (RoPE, SwiGLU).

The arms: ``rmsnorm`` (the reference: satmon's own RMSNorm), ``dyt`` (DyT in place of every block's RMSNorm, with
the DyT paper's LLaMA inits 0.8 / 0.2 for the pre-attention and pre-MLP norms; the ``alpha_init`` option, when set
to a number, overrides them), ``dyt-gelu`` (the same model with a non-gated GELU MLP: the study's control) and
``rmsnorm-gelu`` (its RMSNorm reference). The ``final_norm`` option is the DyT arms' norm before the head:
``"rmsnorm"`` (the default since recipe version 2: the model learns) or ``"dyt"`` (the DyT paper's layout, init
0.2 or ``alpha_init``: at the demo's settings this model is trapped at the byte-unigram level, its final DyT
saturated on an offset shared by every token and no gradient below the head; docs/guides/faq.md). Version 1 built
the ``dyt`` arms with ``final_norm="dyt"``; no LLaMA cell had been scored when the default changed. A GELU arm cannot share the SwiGLU MLP's weights: it is
built under ``torch.manual_seed(spec.seed)`` like the others (so its ``fc_in``/``fc_out`` are LlamaLM's own init
from that seed), then every tensor it shares with the gated model by name and shape (the embedding, attention,
norms, ``lm_head``) is copied from the gated model built under the same seed; so it starts from the reference
arm's weights everywhere the two have a tensor in common, which the grid checks.

Sizes, data and options are the builtin's (:mod:`satmon.grid.builtin`): ``d<width>L<blocks>[H<heads>]``, the
demo's byte corpus (or ``corpus="torch"``), ``data="chunks"`` by default (per-seed chunks, as grid 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from satmon.grid import builtin as gpt
from satmon.grid.recipe import CellSpec, Recipe

__all__ = ["ARMS", "FINAL_NORMS", "RECIPE", "alpha_inits"]

#: The arms: the reference first.
ARMS = ("rmsnorm", "dyt", "dyt-gelu", "rmsnorm-gelu")
#: The ``final_norm`` option's values (the DyT arms' norm before the head); the first is the default.
FINAL_NORMS = ("rmsnorm", "dyt")

OPTIONS: dict[str, Any] = {**{k: v for k, v in gpt.OPTIONS.items() if k not in ("emb_scale", "bias", "dropout")},
                           "alpha_init": "paper", "data": "chunks", "final_norm": FINAL_NORMS[0]}


def alpha_inits(value: Any) -> dict[str, float] | None:
    """The DyT inits the ``alpha_init`` option asks for: ``"paper"`` -> ``None`` (0.8 / 0.2 / 0.2), a number -> all three.

    Example:
        >>> alpha_inits("paper"), alpha_inits("0.5")
        (None, {'alpha_init': 0.5})
    """
    if value == "paper":
        return None
    try:
        a = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Expected --option alpha_init= 'paper' or a number > 0, got {value!r}.") from None
    if not a > 0:
        raise ValueError(f"Expected --option alpha_init= 'paper' or a number > 0, got {value!r}.")
    return {"alpha_init": a}


def _build(spec: CellSpec, norm: str, mlp: str):
    import torch

    from satmon.demos.llama import LlamaLM

    o = spec.options
    d, n, h = gpt.parse_size(spec.size, o["n_heads"])
    torch.manual_seed(spec.seed)
    final = o["final_norm"] if norm == "dyt" else norm
    return LlamaLM(vocab_size=256, d_model=d, n_layers=n, n_heads=h, seq_len=o["seq_len"], norm=norm, mlp=mlp,
                   final_norm=final, **(alpha_inits(o["alpha_init"]) or {}))


def model(spec: CellSpec, arm: str):
    """The arm's LlamaLM, seeded from ``spec.seed`` (a GELU arm: the gated model's shared tensors copied in)."""
    import torch

    norm, _, mlp = arm.partition("-")
    if arm not in ARMS:
        raise ValueError(f"Expected an arm among {', '.join(ARMS)}, got {arm!r}.")
    m = _build(spec, "dyt" if norm == "dyt" else "rmsnorm", mlp or "swiglu")
    if mlp == "gelu":
        gated = _build(spec, "dyt" if norm == "dyt" else "rmsnorm", "swiglu").state_dict()
        with torch.no_grad():
            for k, v in m.state_dict().items():
                if k in gated and gated[k].shape == v.shape:
                    v.copy_(gated[k])
    return m


def check(spec: CellSpec) -> None:
    """The builtin's checks, and the LLaMA model's: an even head size (RoPE), a valid ``alpha_init`` and ``final_norm``."""
    gpt.check(spec)
    d, _, h = gpt.parse_size(spec.size, spec.options["n_heads"])
    if (d // h) % 2:
        raise ValueError(f"Expected an even head size (RoPE rotates pairs), got width {d} / {h} heads in {spec.size!r}.")
    alpha_inits(spec.options["alpha_init"])
    if spec.options["final_norm"] not in FINAL_NORMS:
        raise ValueError(f"Expected --option final_norm= one of {', '.join(FINAL_NORMS)}, got {spec.options['final_norm']!r}.")


def describe(spec: CellSpec) -> dict[str, Any]:
    """The cell's width, depth, heads, DyT inits, the DyT arms' final norm and data."""
    o = spec.options
    d, n, h = gpt.parse_size(spec.size, o["n_heads"])
    out: dict[str, Any] = {"d_model": d, "n_layers": n, "n_heads": h, "alpha_init": o["alpha_init"],
                           "final_norm": o["final_norm"],
                           "data": o["data"], "chunk_bytes": o["chunk_bytes"]}
    if o.get("corpus", "stdlib") == "torch":
        from satmon.demos.corpus import torch_source_identity

        out.update(corpus="torch", **torch_source_identity())
    return out


def shared(o: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in o.items() if k != "n_heads"}


def cost(size: str) -> float:
    """Relative cost of a step (the builtin's, with the SwiGLU MLP's third matrix)."""
    d, n, _ = gpt.parse_size(size, 1)
    return n * d ** 2 * 12 + 256 * d * 2


PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"sizes": ("d16L1",), "budgets": ("2000", "20000"), "seeds": (0,),
              "settings": {"steps": 8, "window": 4, "warmup": 3, "eval_every": 4, "series_every": 2, "offset_every": 1},
              "options": {"seq_len": 16, "batch_size": 4, "n_heads": 2, "val_tokens": 1_024, "val_offset": 40_000,
                          "probe_sequences": 8, "probe_batch": 4, "chunk_bytes": 256}},
}

#: ``satmon grid llama``.
RECIPE = Recipe(name="satmon-llama", data=gpt.data, model=model, tokens_per_step=lambda o: o["batch_size"] * o["seq_len"],
                options=OPTIONS, version="2", params=lambda m: (sum(p.numel() for p in m.parameters()),) * 2, cost=cost,
                presets=PRESETS, shared=shared, check=check, describe=describe, arms=ARMS,
                late_options=gpt.LATE_OPTIONS)
