"""The replay of saved checkpoints: finding and loading checkpoints, the calibration data, the user's model code,
the run they come from, the loop, and the library entry that does it all.

``satmon.replay(paths, ...)`` is :func:`satmon.replay.session.replay_checkpoints`: this package is callable
(``satmon.replay`` is both the package and the entry), so the call works however the package was reached.
``ModelLoader``, ``ReplayRecord`` and ``replay`` (the loop over inspected checkpoints) load on first use, so
``import satmon.replay`` imports no torch.

Example:
    >>> import satmon, satmon.replay
    >>> import inspect
    >>> callable(satmon.replay), satmon.replay.__call__.__doc__.split(":")[0]
    (True, 'Replay every satmon diagnostic over saved checkpoints')
    >>> list(inspect.signature(satmon.replay).parameters)[:4]
    ['paths', 'model', 'factory', 'data']
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["ModelLoader", "Replay", "ReplayRecord", "replay", "replay_checkpoints"]

_NAMES = {"ModelLoader": "satmon.replay.loop", "ReplayRecord": "satmon.replay.loop", "replay": "satmon.replay.loop",
          "Replay": "satmon.replay.session", "replay_checkpoints": "satmon.replay.session"}


def __getattr__(name: str) -> Any:
    if name == "__signature__":  # inspect.signature(satmon.replay): the entry's, loaded on first use
        import inspect

        from satmon.replay.session import replay_checkpoints

        return inspect.signature(replay_checkpoints)
    module = _NAMES.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    from satmon import _compat  # a name of satmon 0.2's satmon.replay module

    return _compat.moved_attribute(__name__, name)


class _CallablePackage(types.ModuleType):
    """``satmon.replay`` itself: calling it is :func:`satmon.replay.session.replay_checkpoints`."""

    def __call__(self, paths: Any, **options: Any) -> Any:
        """Replay every satmon diagnostic over saved checkpoints: :func:`satmon.replay.session.replay_checkpoints`."""
        from satmon.replay.session import replay_checkpoints

        return replay_checkpoints(paths, **options)


sys.modules[__name__].__class__ = _CallablePackage
