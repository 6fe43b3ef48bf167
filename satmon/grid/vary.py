"""``--vary``: grid settings and recipe options given several values, each combination a configuration of its own
(its cells named with the varied values, keyed apart from the others').
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from satmon.grid.config import GridSettings

if TYPE_CHECKING:
    from satmon.grid.recipe import Recipe

__all__ = ["parse_vary", "vary_configs", "vary_suffix"]

#: Grid settings ``--vary`` may not vary: the budgets resolve from ``steps``; ``device`` is where, not what.
_FIXED_SETTINGS = ("steps", "device")


def parse_vary(vary: Mapping[str, Sequence[Any] | str] | Sequence[str] | None) -> dict[str, list[Any]]:
    """``--vary`` axes as ``{key: [values]}`` (values still as given).

    Example:
        >>> parse_vary(["alpha_init=0.5,1", "lr=1e-3"])
        {'alpha_init': ['0.5', '1'], 'lr': ['1e-3']}
    """
    if not vary:
        return {}
    items = vary.items() if isinstance(vary, Mapping) else []
    if not isinstance(vary, Mapping):
        pairs = []
        for text in vary:
            key, sep, values = str(text).partition("=")
            if not sep or not key.strip():
                raise ValueError(f"Expected --vary KEY=V1,V2,..., got {text!r}.")
            pairs.append((key.strip(), values))
        items = pairs
    out: dict[str, list[Any]] = {}
    for key, values in items:
        vals = [v.strip() for v in values.split(",") if v.strip()] if isinstance(values, str) else list(values)
        if not vals:
            raise ValueError(f"Expected at least one value in --vary {key}=V1,V2,..., got none.")
        if key in out:
            raise ValueError(f"Expected each --vary key once, got {key!r} twice: list its values as {key}=V1,V2.")
        out[key] = vals
    return out


def vary_configs(
    recipe: Recipe, settings: GridSettings, opts: dict[str, Any], vary: Mapping[str, list[Any]]
) -> list[tuple[dict[str, Any], GridSettings, dict[str, Any]]]:
    """Every combination of the ``vary`` axes as ``(varied values, settings, options)`` (one, unvaried, without axes).

    An unknown key is refused naming the choices; a value is typed as its default's type.
    """
    import dataclasses
    import itertools

    from satmon.grid.recipe import _typed

    fields = {
        f.name: getattr(settings, f.name) for f in dataclasses.fields(GridSettings) if f.name not in _FIXED_SETTINGS
    }
    options = recipe.all_options()
    typed: dict[str, list[Any]] = {}
    for key, values in vary.items():
        if key in options:
            typed[key] = [_typed(key, v, options[key], "--vary") for v in values]
        elif key in fields:
            default = fields[key]
            typed[key] = [_typed(key, v, default, "--vary") for v in values]
        else:
            raise ValueError(
                f"Expected --vary KEY among the recipe {recipe.name!r}'s options ({', '.join(sorted(options))}) "
                f"or the grid settings ({', '.join(sorted(fields))}), got {key!r}"
                + (" (the budgets resolve from --steps: run one grid per --steps)" if key == "steps" else "")
                + "."
            )
        if len({json.dumps(v) for v in typed[key]}) != len(typed[key]):
            raise ValueError(f"Expected distinct --vary {key} values, got {values}.")
    if not typed:
        return [({}, settings, opts)]
    out = []
    for combo in itertools.product(*typed.values()):
        v = dict(zip(typed, combo))
        st = dataclasses.replace(settings, **{k: x for k, x in v.items() if k in fields and k not in options})
        st.check()
        o = recipe.options_with({**opts, **{k: x for k, x in v.items() if k in options}})
        out.append((v, st, o))
    return out


def vary_suffix(vary: Mapping[str, Any]) -> str:
    """The varied values in a cell's name (file-name safe).

    Example:
        >>> vary_suffix({"alpha_init": 0.5, "lr": 0.001})
        '_alpha_init0.5_lr0.001'
    """
    import re

    return "".join(f"_{k}{re.sub(r'[^A-Za-z0-9._+-]', '-', str(v))}" for k, v in vary.items())
