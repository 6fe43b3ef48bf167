"""satmon: watch activation saturation from inside transformer training.

The public names load on first use (PEP 562): ``import satmon`` imports neither torch nor
Lightning, ``satmon.Screen``, ``satmon.probe`` and ``satmon.Verdict`` load torch but no Lightning,
and ``satmon.SaturationMonitor`` loads Lightning when it is first touched.

``satmon.__all__`` is the API a user calls: the drivers, the settings, the screen, probe, replay and forecast,
and what they return. The mechanism under them is imported from its module (``satmon.results.verdict``'s
``build_verdict``, ``satmon.observe.counters``...); the names satmon 0.4 exported here still read, with a
deprecation warning (:data:`satmon._compat.MOVED_IN_0_5`).

Example:
    >>> import satmon
    >>> sorted(n for n in ("DyT", "SaturationMonitor", "convert_to_dyt") if n in dir(satmon))
    ['DyT', 'SaturationMonitor', 'convert_to_dyt']
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from satmon import _compat
from satmon._version import __version__

_compat.install()  # satmon 0.2's import paths, with a warning, until satmon 0.5 (_compat.REMOVED_IN)

#: public name -> the module that defines it
_PUBLIC = {
    "DyT": "satmon.dyt",
    "convert_to_dyt": "satmon.convert",
    "SaturationMonitor": "satmon.drivers.lightning",
    "Screen": "satmon.screen.screen",
    "Settings": "satmon.settings",
    "Verdict": "satmon.results.verdict",
    "SatmonAbort": "satmon.results.stop",
    "StopReason": "satmon.results.stop",
    "find_dyt_layers": "satmon.model.map",
    "find_norm_layers": "satmon.model.map",
    "find_blocks": "satmon.model.map",
    "probe": "satmon.probing.passes",
    "replay": "satmon.replaying.session",
    "forecast": "satmon.io.known_cells",
    "Forecast": "satmon.results.forecast",
    "ProbeReport": "satmon.results.probe_report",
}

__all__ = ["__version__", *_PUBLIC]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from satmon.convert import convert_to_dyt
    from satmon.drivers.lightning import SaturationMonitor
    from satmon.dyt import DyT
    from satmon.io.known_cells import forecast
    from satmon.model.map import find_blocks, find_dyt_layers, find_norm_layers
    from satmon.probing.passes import probe
    from satmon.replaying.session import replay
    from satmon.results.forecast import Forecast
    from satmon.results.probe_report import ProbeReport
    from satmon.results.stop import SatmonAbort, StopReason
    from satmon.results.verdict import Verdict
    from satmon.screen.screen import Screen
    from satmon.settings import Settings


#: subpackages a user reaches as ``satmon.NAME`` without importing them first (``satmon.grid.run``)
_SUBPACKAGES = ("grid",)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"satmon.{name}")  # the import sets the attribute: later reads skip this
    module = _PUBLIC.get(name)
    if module is None:
        return _compat.moved_attribute("satmon", name)
    imported = importlib.import_module(module)
    value = getattr(imported, name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
