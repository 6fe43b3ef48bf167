"""satmon: watch activation saturation from inside transformer training."""

from satmon.dyt import DyT

__all__ = ["DyT"]
__version__ = "0.1.0"
