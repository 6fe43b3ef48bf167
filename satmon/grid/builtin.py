"""``satmon grid builtin``: satmon's faithful grid as a recipe (the regime study's protocol at CPU scale).

Moved from ``examples/regime_grid.py`` (0.4): satmon's GPT-2-style demo model (``alpha_init`` 2.0, no bias
anywhere, dropout 0, GPT-2 init with embeddings unscaled) on the demo's byte corpus. A size is
``d<width>L<blocks>`` (``H<heads>`` optional, else the ``n_heads`` option); a budget's unique bytes are the
corpus prefix (``data="prefix"``, 0.4's grid: every seed the same text) or ``chunk_bytes`` chunks chosen per
seed (``data="chunks"``, the second grid, docs/plans/grid2_plan.md). The held-out split starts at ``val_offset``,
after every budget. Every cell of the faithful grid's JSON (``data/faithful_grid.json``) comes out of this
recipe to the last digit on the same machine and torch (tests/grid/test_builtin.py checks the smoke cells
against the pre-move script).

Presets: ``full`` (2 sizes x 4 budgets x 2 seeds, ~2 CPU-hours), ``quick`` (2 of its cells), ``smoke`` (4 tiny
cells, 8 steps: seconds), ``grid2`` (docs/plans/grid2_plan.md's 30 cells).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from satmon.grid.recipe import CellData, CellSpec, Recipe

__all__ = ["RECIPE", "Batches", "cell_tokens", "corpus", "parse_size", "unigram_loss"]

#: The recipe's options (the faithful grid's GridConfig fields that are not the grid's shared settings).
OPTIONS: dict[str, Any] = {
    "seq_len": 64, "batch_size": 16, "n_heads": 4, "alpha_init": 2.0, "emb_scale": 1.0, "bias": False, "dropout": 0.0,
    "val_tokens": 65_536, "val_offset": 4_400_000,  # the held-out split starts here, after every training budget
    "probe_sequences": 400, "probe_batch": 50,  # 400 x 64 = 25,600 tokens: the study's 50 sequences of 512
    "data": "prefix", "chunk_bytes": 2_048,
}


#: Options added after the faithful and second grids' cells were keyed (at their defaults they stay out of the key).
#: ``corpus``: ``"stdlib"`` (the demo's corpus, Python's standard library) or ``"torch"`` (the installed torch's own
#: ``*.py`` sources, ~46 MB: budgets below one pass; its held-out split is its last ``val_tokens`` bytes).
LATE_OPTIONS: dict[str, Any] = {"corpus": "stdlib"}


def parse_size(text: str, n_heads: int = 4) -> tuple[int, int, int]:
    """``(width, blocks, heads)`` of a size name ``d<width>L<blocks>`` or ``d<width>L<blocks>H<heads>``.

    Example:
        >>> parse_size("d64L2"), parse_size("d96L3H4"), parse_size("d16L1", n_heads=2)
        ((64, 2, 4), (96, 3, 4), (16, 1, 2))
    """
    m = re.fullmatch(r"d(\d+)L(\d+)(?:H(\d+))?", text.strip())
    if m is None:
        raise ValueError(f"Expected a size like 'd64L2' (width 64, 2 blocks) or 'd96L3H4', got {text!r}.")
    d, n, h = int(m[1]), int(m[2]), int(m[3] or n_heads)
    if d < 1 or n < 1 or h < 1 or d % h:
        raise ValueError(f"Expected width, blocks and heads >= 1 with the width a multiple of the heads, got {text!r}.")
    return d, n, h


def cost(size: str) -> float:
    """Relative cost of one step of a size (matmul work ~ layers x width^2, plus the byte embedding)."""
    d, n, _ = parse_size(size, 1)
    return n * d ** 2 * 12 + 256 * d * 2


def corpus(o: Mapping[str, Any]):
    """``(train_tokens_all, val_inputs, val_targets)``: the corpus the budgets cut from, and the held-out split as
    non-overlapping ``(N, seq_len)`` windows (the same bytes for every cell)."""
    from satmon.demos.corpus import corpus_tokens, torch_source_tokens

    if o.get("corpus", "stdlib") == "torch":
        tokens = torch_source_tokens()
        cut = tokens.numel() - o["val_tokens"] - 1
        val, train = tokens[cut:], tokens[:cut]
        n = (val.numel() - 1) // o["seq_len"]
        return train, val[: n * o["seq_len"]].view(n, o["seq_len"]), val[1 : n * o["seq_len"] + 1].view(n, o["seq_len"])
    tokens = corpus_tokens(o["val_offset"] + o["val_tokens"] + 1)
    val = tokens[o["val_offset"]:]
    n = (val.numel() - 1) // o["seq_len"]
    x = val[: n * o["seq_len"]].view(n, o["seq_len"])  # (N, T)
    y = val[1 : n * o["seq_len"] + 1].view(n, o["seq_len"])  # (N, T)
    return tokens[: o["val_offset"]], x, y


def unigram_loss(train: Any, val_targets: Any) -> float:
    """Held-out loss (nats/byte) of add-one byte frequencies of the training split: the loss of a
    model that ignores the context. A run that ends at or above it has learnt nothing else."""
    import torch

    p = torch.bincount(train, minlength=256).double() + 1.0
    return float(-(p / p.sum()).log()[val_targets.reshape(-1)].mean())


def cell_tokens(o: Mapping[str, Any], train_all: Any, nbytes: int, seed: int) -> Any:
    """The ``nbytes`` unique training bytes of a cell.

    ``data="prefix"`` (0.4's faithful grid): the corpus prefix, the same text for every seed. ``data="chunks"``
    (the second grid): the training split cut into ``chunk_bytes`` chunks, shuffled by a generator seeded with the
    cell's seed; the budget is the first ``ceil(nbytes / chunk_bytes)`` chunks of that order, concatenated and cut
    to ``nbytes``. So the budgets of one seed are nested (a smaller budget's text is inside a larger one's) and two
    seeds train on different text; the held-out split (from ``val_offset``) is never drawn.
    """
    import torch

    if o["data"] == "prefix":
        return train_all[:nbytes]
    c = o["chunk_bytes"]
    n_chunks = train_all.numel() // c
    need = -(-nbytes // c)
    if need > n_chunks:
        raise ValueError(f"Expected a budget of at most {n_chunks * c:,} bytes ({n_chunks} chunks of {c}), got {nbytes:,}.")
    order = torch.randperm(n_chunks, generator=torch.Generator().manual_seed(1_000_003 + seed))  # (n_chunks,)
    chunks = train_all[: n_chunks * c].view(n_chunks, c)[order[:need]]  # (need, c)
    return chunks.reshape(-1)[:nbytes].clone()


class Batches:
    """Random ``(B, T)`` windows of the training split from a seeded generator (the study's ``get_batch``):
    both arms of a cell draw the same batches in the same order."""

    def __init__(self, tokens: Any, batch_size: int, seq_len: int, seed: int) -> None:
        import torch

        self.tokens, self.B, self.T = tokens, batch_size, seq_len
        self.g = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(seq_len + 1)  # (T + 1,)

    def __iter__(self) -> Batches:
        return self

    def __next__(self):
        import torch

        starts = torch.randint(0, self.tokens.numel() - self.T - 1, (self.B,), generator=self.g)  # (B,)
        chunk = self.tokens[starts[:, None] + self.offsets]  # (B, T + 1)
        return chunk[:, :-1], chunk[:, 1:]


def windows_of(o: Mapping[str, Any], tokens: Any) -> list[Any]:
    """The first ``probe_sequences`` non-overlapping ``seq_len`` windows of ``tokens``, in batches."""
    n = min(o["probe_sequences"], (tokens.numel() - 1) // o["seq_len"])
    return list(tokens[: n * o["seq_len"]].view(n, o["seq_len"]).split(o["probe_batch"]))  # (n, T) in batches


def data(spec: CellSpec) -> CellData:
    """The cell's data: its unique bytes, both arms' batch stream, the held-out split, the probe's sequences."""
    o = spec.options
    train_all, vx, vy = corpus(o)
    train = cell_tokens(o, train_all, spec.unique_tokens, spec.seed)
    return CellData(train=lambda: Batches(train, o["batch_size"], o["seq_len"], spec.seed), val_inputs=vx, val_targets=vy,
                    probe=windows_of(o, train), probe_heldout=windows_of(o, vx.reshape(-1)), example_input=vx[:2],
                    unique_tokens=spec.unique_tokens, unigram_loss=unigram_loss(train, vy))


def model(spec: CellSpec, norm: str):
    """The demo GPT with ``norm``; seeded, so both arms of a cell start from the same weights (the norms
    draw no random numbers)."""
    import torch

    from satmon.demos.gpt import GPT, GPTConfig

    o = spec.options
    d, n, h = parse_size(spec.size, o["n_heads"])
    torch.manual_seed(spec.seed)
    return GPT(GPTConfig(d_model=d, n_layers=n, n_heads=h, seq_len=o["seq_len"], norm=norm, alpha_init=o["alpha_init"],
                         emb_scale=o["emb_scale"], bias=o["bias"], dropout=o["dropout"]))


def count_params(m: Any) -> tuple[int, int]:
    """``(params, params_total)``: nanoGPT's ``get_num_params`` (all but the position embedding; the tied
    token embedding counted once), as the study sizes its models, and every parameter."""
    total = sum(p.numel() for p in m.parameters())
    return total - m.pos_emb.weight.numel(), total


def check(spec: CellSpec) -> None:
    """Refuse a cell this recipe cannot run, naming the option (before any job starts)."""
    o = spec.options
    parse_size(spec.size, o["n_heads"])
    if o["data"] not in ("prefix", "chunks"):
        raise ValueError(f"Expected --option data=prefix or data=chunks, got {o['data']!r}.")
    if o["chunk_bytes"] <= o["seq_len"] + 1:
        raise ValueError(f"Expected chunk_bytes > seq_len + 1 = {o['seq_len'] + 1}, got {o['chunk_bytes']}.")
    if o.get("corpus", "stdlib") not in ("stdlib", "torch"):
        raise ValueError(f"Expected --option corpus=stdlib or corpus=torch, got {o['corpus']!r}.")
    if o.get("corpus", "stdlib") == "torch":
        from satmon.demos.corpus import torch_source_identity

        room = torch_source_identity()["corpus_bytes"] - o["val_tokens"] - 1
        if spec.unique_tokens + o["seq_len"] >= room:
            raise ValueError(f"Expected every budget below the torch corpus's training split ({room:,} bytes), got "
                             f"{spec.unique_tokens:,} bytes ({spec.budget}): use fewer bytes or more epochs.")
    elif spec.unique_tokens + o["seq_len"] >= o["val_offset"]:
        raise ValueError(f"Expected every budget below the held-out split ({o['val_offset']:,} bytes), got "
                         f"{spec.unique_tokens:,} bytes ({spec.budget}): use fewer bytes or more epochs.")
    if spec.unique_tokens <= o["seq_len"] + 1:
        raise ValueError(f"Expected budgets of more than seq_len + 1 = {o['seq_len'] + 1} bytes, got {spec.unique_tokens} "
                         f"({spec.budget}).")


def describe(spec: CellSpec) -> dict[str, Any]:
    """The cell's width, depth and heads, and the DyT arm's settings (the faithful grid's fields)."""
    o = spec.options
    d, n, h = parse_size(spec.size, o["n_heads"])
    out: dict[str, Any] = {"d_model": d, "n_layers": n, "n_heads": h, "alpha_init": o["alpha_init"], "emb_scale": o["emb_scale"]}
    if o["data"] != "prefix":
        out.update(data=o["data"], chunk_bytes=o["chunk_bytes"])
    if o.get("corpus", "stdlib") == "torch":
        from satmon.demos.corpus import torch_source_identity

        out.update(corpus="torch", **torch_source_identity())
    return out


def shared(o: Mapping[str, Any]) -> dict[str, Any]:
    """The options as cells record them in ``config``: the faithful grid's (``n_heads`` is the cell's own field; ``data``
    and ``chunk_bytes`` only where the budget is drawn as chunks, so 0.4's cells keep their config). The cells' key
    holds every option."""
    out = {k: v for k, v in o.items() if k != "n_heads"}
    if o["data"] == "prefix":
        out.pop("data")
        out.pop("chunk_bytes")
    return out


STUDY_EPOCHS = ("164ep", "16ep", "3.3ep", "1.4ep")
GRID2_EPOCHS = ("3.3ep", "16ep", "32ep", "64ep", "100ep", "164ep")
PRESETS: dict[str, dict[str, Any]] = {
    "full": {"sizes": ("d64L2", "d96L3"), "budgets": STUDY_EPOCHS, "seeds": (0, 1)},
    # two cells of the full grid, same settings (the same numbers on the same machine)
    "quick": {"sizes": ("d64L2",), "budgets": ("164ep", "1.4ep"), "seeds": (0,)},
    "smoke": {"sizes": ("d16L1", "d24L1"), "budgets": ("2000", "20000"), "seeds": (0,),
              "settings": {"steps": 8, "window": 4, "warmup": 3, "eval_every": 4, "series_every": 2, "offset_every": 1},
              "options": {"seq_len": 16, "batch_size": 4, "n_heads": 2, "val_tokens": 1_024, "val_offset": 40_000,
                          "probe_sequences": 8, "probe_batch": 4, "alpha_init": 2.0, "emb_scale": 40.0}},
    "grid2": {"sizes": ("d48L2", "d64L2", "d96L3"), "budgets": GRID2_EPOCHS, "seeds": (2, 3),
              "options": {"data": "chunks"}, "size_budgets": {"d96L3": ("32ep", "64ep", "100ep")}},
}

#: satmon's faithful grid (``satmon grid builtin``).
RECIPE = Recipe(name="satmon-faithful-gpt", data=data, model=model,
                tokens_per_step=lambda o: o["batch_size"] * o["seq_len"], options=OPTIONS, version="1",
                params=count_params, cost=cost, presets=PRESETS, shared=shared, check=check, describe=describe,
                late_options=LATE_OPTIONS)
