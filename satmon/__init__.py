"""satmon: watch activation saturation from inside transformer training.

Example:
    >>> import satmon
    >>> sorted(n for n in ("DyT", "SaturationMonitor", "convert_to_dyt") if hasattr(satmon, n))
    ['DyT', 'SaturationMonitor', 'convert_to_dyt']
"""

from satmon import _deprecated
from satmon.abort import SatmonAbort, StopReason
from satmon.callback import SaturationMonitor
from satmon.convert import convert_to_dyt
from satmon.core.saturation_hooks import SaturationCounter, SaturationHooks
from satmon.core.screen import Screen
from satmon.discovery import find_blocks, find_dyt_layers, find_norm_layers
from satmon.dyt import DyT
from satmon.probing import probe
from satmon.report import ProbeReport
from satmon.verdict import LayerCounts, Source, Verdict, build_verdict, decide

_deprecated.install()

__all__ = [
    "DyT", "convert_to_dyt", "SaturationMonitor", "Screen", "Verdict", "build_verdict", "LayerCounts", "Source", "decide",
    "SatmonAbort", "StopReason", "SaturationCounter", "SaturationHooks", "find_dyt_layers", "find_norm_layers",
    "find_blocks", "probe", "ProbeReport",
]
__version__ = "0.2.0"


def __getattr__(name: str):
    if name == "Report":  # 0.1's name of the probe's result
        import warnings

        warnings.warn("satmon.Report is deprecated since satmon 0.2; use satmon.ProbeReport.", DeprecationWarning, stacklevel=2)
        return ProbeReport
    raise AttributeError(f"module 'satmon' has no attribute {name!r}")
