"""``satmon replay``: every diagnostic over saved checkpoints, read safely (no code stored in a file
runs unless the user opts in): finding and loading checkpoints, the calibration data, the user's
model code, and the replay loop.

``replay``, ``ModelLoader`` and ``ReplayRecord`` load on first use, so ``import satmon.replay``
imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ModelLoader", "ReplayRecord", "replay"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("satmon.replay.loop"), name)
    from satmon import _compat  # a name of satmon 0.2's satmon.replay module

    return _compat.moved_attribute(__name__, name)
