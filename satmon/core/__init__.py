"""The framework-free core: hooks, counters, gated-MLP detection, the collapse watch and the screen
that a training loop drives. Nothing here imports Lightning."""
