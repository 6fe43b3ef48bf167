"""The replay of saved checkpoints: the function is :func:`satmon.replay` (:func:`satmon.replaying.session.replay`),
its options :class:`~satmon.replaying.options.ReplayOptions`; this package holds how it is done (the checkpoints'
listing and formats, the calibration data, the user's model code, the run they come from, the loop).

``import satmon.replaying`` imports no torch. How one checkpoint is read, step by step:
``docs/reference/architecture.md`` ("A replay's walk").

Example:
    >>> import satmon
    >>> callable(satmon.replay)  # the function (after an old ``import satmon.replay``, its callable alias module)
    True
"""

from typing import Any


def __getattr__(name: str) -> Any:
    from satmon import _compat  # a name of satmon 0.2's (or 0.4's) satmon.replay package

    return _compat.moved_attribute(__name__, name)
