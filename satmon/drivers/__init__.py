"""Framework drivers of :class:`~satmon.screen.screen.Screen`: the Lightning callback
(:mod:`satmon.drivers.lightning`, with its live probe) and the Hugging Face Trainer callback
(:mod:`satmon.drivers.hf`). Nothing is imported here, so importing this package needs no framework.

A plain PyTorch loop or a Lightning Fabric loop drives :class:`satmon.Screen` directly
(``examples/plain_pytorch.py``, ``examples/fabric_loop.py``, ``docs/guides/integrations.md``).
"""
