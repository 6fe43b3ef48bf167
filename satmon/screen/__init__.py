"""The screen a training loop drives (:class:`~satmon.screen.screen.Screen`) and what it owns: its
checkpoint state, the collapse watch, the non-finite guard, the stop policy and how ranks agree.
Framework-free: Lightning and the Hugging Face Trainer drive it from :mod:`satmon.drivers`."""
