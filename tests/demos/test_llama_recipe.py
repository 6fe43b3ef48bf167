"""``satmon grid llama``'s arms and its ``final_norm`` option: what each builds, and what docs/guides/grid.md says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from satmon import DyT
from satmon.demos.gpt import RMSNorm
from satmon.grid import builtin_llama
from satmon.grid.recipe import CellSpec

RECIPE = builtin_llama.RECIPE
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "grid.md"


def _spec(**options) -> CellSpec:
    o = RECIPE.options_with({"seq_len": 16, "n_heads": 2, **options})
    return CellSpec(
        size="d16L1", budget="2000", unique_tokens=2_000, seed=0, steps=8, processed_tokens=8 * 64, options=o
    )


def _norms(model) -> tuple[str, str]:
    return type(model.blocks[0].mlp_norm).__name__, type(model.norm_f).__name__


def test_every_arm_builds_its_norms_and_final_norm_dyt_is_the_trapped_layout():
    assert RECIPE.arms == builtin_llama.ARMS == ("rmsnorm", "dyt", "dyt-gelu", "rmsnorm-gelu")
    assert RECIPE.options_with({})["final_norm"] == "rmsnorm" and builtin_llama.FINAL_NORMS == ("rmsnorm", "dyt")
    default, trapped = _spec(), _spec(final_norm="dyt")
    assert {a: _norms(RECIPE.model(default, a)) for a in RECIPE.arms} == {
        "rmsnorm": ("RMSNorm", "RMSNorm"),
        "dyt": ("DyT", "RMSNorm"),
        "dyt-gelu": ("DyT", "RMSNorm"),
        "rmsnorm-gelu": ("RMSNorm", "RMSNorm"),
    }
    assert {a: _norms(RECIPE.model(trapped, a)) for a in RECIPE.arms} == {
        "rmsnorm": ("RMSNorm", "RMSNorm"),
        "dyt": ("DyT", "DyT"),  # the reference arms keep RMSNorm everywhere
        "dyt-gelu": ("DyT", "DyT"),
        "rmsnorm-gelu": ("RMSNorm", "RMSNorm"),
    }
    final = RECIPE.model(_spec(final_norm="dyt", alpha_init="2"), "dyt").norm_f
    assert isinstance(final, DyT) and final.alpha.item() == 2.0  # alpha_init reaches a DyT final norm
    assert isinstance(RECIPE.model(trapped, "dyt").norm_f, DyT) and RECIPE.model(
        trapped, "dyt"
    ).norm_f.alpha.item() == pytest.approx(0.2)
    assert isinstance(RECIPE.model(default, "dyt").norm_f, RMSNorm)
    assert RECIPE.describe(trapped)["final_norm"] == "dyt" and RECIPE.version == "2"


def test_a_final_norm_that_is_not_one_of_the_two_is_refused_before_work():
    with pytest.raises(ValueError, match=r"Expected --option final_norm= one of rmsnorm, dyt, got 'layernorm'"):
        RECIPE.check(_spec(final_norm="layernorm"))


def test_the_grid_guide_says_what_the_recipe_builds():
    text = GUIDE.read_text()
    section = text[text.index("## `satmon grid llama`") :]
    section = section[: section.index("\n## ", 4)]
    for arm in RECIPE.arms:
        assert f"`{arm}`" in section
    assert re.search(r"`--option final_norm=dyt`", section) and "default `rmsnorm`" in section


def test_vary_final_norm_gives_one_configuration_per_final_norm():
    """``--vary final_norm=rmsnorm,dyt`` (what the guide says runs both): two configurations, each keyed apart."""
    from satmon.grid.config import GridSettings
    from satmon.grid.vary import parse_vary, vary_configs

    configs = vary_configs(
        RECIPE,
        GridSettings(steps=8, window=4, warmup=3),
        RECIPE.options_with({}),
        parse_vary(["final_norm=rmsnorm,dyt"]),
    )
    assert [(v, o["final_norm"]) for v, _, o in configs] == [
        ({"final_norm": "rmsnorm"}, "rmsnorm"),
        ({"final_norm": "dyt"}, "dyt"),
    ]
    with pytest.raises(ValueError, match="final_norm"):
        RECIPE.check(_spec(final_norm="DyT"))
