"""The attach / detach / enable life cycle shared by satmon's forward-hook sets."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils.hooks import RemovableHandle

__all__ = ["HookSet", "paused", "recomputing"]


class HookSet:
    """A set of forward hooks that can be attached, detached, and switched off without detaching.

    ``enabled`` is a plain Python flag read at the top of each hook: under ``torch.compile`` it is a
    guard, so flipping it (window over, watch step) costs at most one extra graph, never a
    recompile per step. Subclasses implement :meth:`_register`.
    """

    def __init__(self) -> None:
        self.enabled = True
        self._handles: list[RemovableHandle] = []

    def _register(self) -> list[RemovableHandle]:
        raise NotImplementedError

    def attach(self):
        """Register the hooks (idempotent); returns ``self``."""
        if not self._handles:
            self._handles = self._register()
        return self

    def detach(self) -> None:
        """Remove the hooks: afterwards forward passes run no code of this set."""
        for h in self._handles:
            h.remove()
        self._handles = []

    @property
    def attached(self) -> bool:
        return bool(self._handles)


@contextmanager
def paused(*hook_sets: HookSet | None) -> Iterator[None]:
    """Switch hook sets off for a block (validation, a probe's forwards) and restore each one's state.

    Example:
        >>> class Nothing(HookSet):
        ...     def _register(self):
        ...         return []
        >>> h = Nothing()
        >>> with paused(h, None):
        ...     h.enabled
        False
        >>> h.enabled
        True
    """
    sets = [h for h in hook_sets if h is not None]
    before = [h.enabled for h in sets]
    for h in sets:
        h.enabled = False
    try:
        yield
    finally:
        for h, on in zip(sets, before):
            h.enabled = on


def recomputing() -> bool:
    """Whether a forward runs inside a backward pass: activation checkpointing re-running a forward it
    already ran. satmon's hooks skip those, so each training forward is counted once (eager only:
    under ``torch.compile`` the check is not traced and a checkpointed forward counts twice).

    Example:
        >>> recomputing()
        False
    """
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1
