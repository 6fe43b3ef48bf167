"""Drivers of satmon's framework-free :class:`~satmon.core.screen.Screen` for other training loops.

- :mod:`satmon.integrations.hf`: ``SatmonTrainerCallback`` for the Hugging Face ``Trainer``
  (``pip install 'satmon[hf]'``; ``transformers`` is imported only when that module is).

A plain PyTorch loop or a Lightning Fabric loop drives :class:`satmon.Screen` directly
(``examples/plain_pytorch.py``, ``examples/fabric_loop.py``, ``docs/integrations.md``).

Nothing is imported here, so ``import satmon.integrations`` never needs an optional dependency.
"""

__all__: list[str] = []
