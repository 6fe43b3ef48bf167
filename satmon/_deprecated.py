"""Deprecated module aliases kept for one release (0.2): old import paths still work, with a warning."""

from __future__ import annotations

import importlib
import sys
import types
import warnings

#: old module path -> new module path
MOVED = {
    "satmon.probe": "satmon.probing",
    "satmon.functional.deadir": "satmon.functional.dead_directions",
    "satmon.hooks": "satmon.core.hookset",
    "satmon.saturation": "satmon.core.saturation_hooks",
    "satmon.collapse": "satmon.core.gate_hooks",
    "satmon.gating": "satmon.core.gated_mlp",
    "satmon.models": "satmon.demos",
    "satmon.models.gpt": "satmon.demos.gpt",
    "satmon.models.llama": "satmon.demos.llama",
    "satmon.models.lit": "satmon.demos.lit",
    "satmon.data": "satmon.demos.corpus",
}


class _Alias(types.ModuleType):
    """A module object that forwards attribute reads to the new module and warns once per name."""

    def __init__(self, old: str, new: str) -> None:
        super().__init__(old, f"Deprecated alias of {new}.")
        self.__dict__["_new"] = new

    def __getattr__(self, name: str):
        new = self.__dict__["_new"]
        if name.startswith("__"):
            raise AttributeError(name)
        warnings.warn(f"{self.__name__} is deprecated since satmon 0.2; import {name} from {new}.", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)


def install() -> None:
    """Register the aliases in ``sys.modules`` (the new modules are imported on first attribute read).

    ``satmon.probe`` stays the function in the package namespace; ``import satmon.probe`` and
    ``from satmon.probe import feed_first`` reach the alias module.
    """
    for old, new in MOVED.items():
        sys.modules.setdefault(old, _Alias(old, new))
