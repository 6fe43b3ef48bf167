"""A model held weakly: what satmon keeps of a model it watches.

satmon's hooks live on the model, so anything they reach must not hold the model object itself, and a screen its
user keeps (for its card, in a list of runs) must not keep the model object alive: a DDP model would outlive
``destroy_process_group``, where freeing it can deadlock PyTorch (docs/reference/distributed.md). (The modules and
parameters a screen reads stay with the screen until it is dropped.) :class:`WeakModel` is the one way satmon's
objects hold their model.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn


class WeakModel:
    """A class attribute that holds a model weakly.

    Reading it gives the model, or ``None`` before it is set and once the model is freed; with ``required``, a read
    after the model was freed raises instead (an object that cannot work without its model).
    :meth:`held` reads it without raising.

    Args:
        required: raise ``RuntimeError`` on a read once the model is freed.

    Example:
        >>> import gc, torch
        >>> class Watcher:
        ...     model = WeakModel()
        >>> w, net = Watcher(), torch.nn.Linear(2, 2)
        >>> w.model = net
        >>> w.model is net
        True
        >>> del net; _ = gc.collect()
        >>> w.model is None
        True
    """

    def __init__(self, required: bool = False) -> None:
        self.required = required
        self._slot = ""  # set by __set_name__, from the attribute's name

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}_weakref"

    def held(self, obj: Any) -> nn.Module | None:
        """The model ``obj`` holds, ``None`` before it is set or once it is freed (never raises)."""
        ref = obj.__dict__.get(self._slot)
        return None if ref is None else ref()

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        model = self.held(obj)
        if model is None and self.required and obj.__dict__.get(self._slot) is not None:
            raise RuntimeError(
                f"Expected the model this {type(obj).__name__} reads to be alive, got one that was freed: satmon "
                "holds a model weakly, so read it while the model is in use."
            )
        return model

    def __set__(self, obj: Any, model: nn.Module | None) -> None:
        obj.__dict__[self._slot] = None if model is None else weakref.ref(model)
