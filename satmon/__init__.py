"""satmon: watch activation saturation from inside transformer training.

Example:
    >>> import satmon
    >>> sorted(n for n in ("DyT", "SaturationMonitor", "convert_to_dyt") if hasattr(satmon, n))
    ['DyT', 'SaturationMonitor', 'convert_to_dyt']
"""

from satmon.abort import SatmonAbort, StopReason
from satmon.callback import SaturationMonitor
from satmon.convert import convert_to_dyt
from satmon.discovery import find_blocks, find_dyt_layers, find_norm_layers
from satmon.dyt import DyT
from satmon.probe import Report, probe
from satmon.saturation import SaturationCounter, SaturationHooks
from satmon.verdict import Verdict, decide

__all__ = [
    "DyT", "convert_to_dyt", "SaturationMonitor", "Verdict", "decide", "SatmonAbort", "StopReason",
    "SaturationCounter", "SaturationHooks", "find_dyt_layers", "find_norm_layers", "find_blocks", "probe", "Report",
]
__version__ = "0.1.0"
