"""Every deprecated import path and name, in one place: satmon 0.2's module paths and the names that moved.

satmon 0.3 moved its modules into folders that show the layers (``docs/reference/architecture.md``). The 0.2
paths keep working until satmon 0.5 (a release later than 0.3 announced): importing one, or reading a name from it,
gives a :class:`SatmonDeprecationWarning` that names the new home. The 0.1 aliases (deprecated in 0.2) are gone.
What moved in 0.4 and 0.5 (:data:`MOVED_IN_0_4`, :data:`MOVED_IN_0_5`, :data:`MODULES_MOVED_IN_0_5`) works until
0.6, and :func:`deprecated` says the same for an argument or an attribute.

Example:
    >>> import sys, warnings
    >>> _ = sys.modules.pop("satmon.callback", None)  # a fresh import, as in a new process
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     from satmon.callback import SaturationMonitor
    >>> SaturationMonitor.__module__, caught[0].category.__name__
    ('satmon.drivers.lightning', 'SatmonDeprecationWarning')
    >>> print(caught[0].message)
    satmon.callback is deprecated since satmon 0.3: use satmon.drivers.lightning (the old path works until satmon 0.5).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

__all__ = [
    "MODULES",
    "MODULES_MOVED_IN_0_5",
    "MOVED_IN_0_4",
    "MOVED_IN_0_5",
    "NAMES",
    "REMOVED_IN",
    "SatmonDeprecationWarning",
    "deprecated",
    "install",
    "moved_attribute",
]

#: The release that drops these paths.
REMOVED_IN = "0.5"


class SatmonDeprecationWarning(DeprecationWarning):
    """A satmon import path or name that moved; the message says where to."""


#: satmon 0.2 module path -> its 0.3 home (``None``: a 0.2 package that holds nothing of its own now)
MODULES: dict[str, str | None] = {
    "satmon.abort": "satmon.results.stop",
    "satmon.verdict": "satmon.results.verdict",
    "satmon.verdict_card": "satmon.results.card",
    "satmon.report": "satmon.results.probe_report",
    "satmon.discovery": "satmon.model.discovery",
    "satmon.functional.affine": "satmon.model.affine",
    "satmon.probe_targets": "satmon.probing.targets",
    "satmon.checkpoints": "satmon.replaying.checkpoints",
    "satmon.calibration_data": "satmon.replaying.data",
    "satmon.user_code": "satmon.replaying.user_code",
    "satmon.calibrate_runs": "satmon.calibrate.runs",
    "satmon.callback": "satmon.drivers.lightning",
    "satmon.live_probe": "satmon.drivers.live_probe",
    "satmon.core": None,
    "satmon.core.dataflow": "satmon.model.dataflow",
    "satmon.core.gated_mlp": "satmon.model.gating",
    "satmon.core.gated_mlp_names": "satmon.model.gating_names",
    "satmon.core.model_state": "satmon.model.frozen_forward",
    "satmon.core.hookset": "satmon.observe.hookset",
    "satmon.core.counters": "satmon.observe.counters",
    "satmon.core.saturation_hooks": "satmon.observe.saturation",
    "satmon.core.offset_hooks": "satmon.observe.offset",
    "satmon.core.gate_hooks": "satmon.observe.gate",
    "satmon.core.covariance_taps": "satmon.observe.covariance",
    "satmon.core.window_loss": "satmon.observe.window_loss",
    "satmon.core.collapse_watch": "satmon.screen.watch",
    "satmon.core.nonfinite_guard": "satmon.screen.nonfinite_guard",
    "satmon.core.stop_policy": "satmon.screen.stop_policy",
    "satmon.core.agreement": "satmon.screen.agreement",
    "satmon.core.screen": "satmon.screen.screen",
    "satmon.core.screen_parts": "satmon.screen.screen",
    "satmon.core.window_verdict": "satmon.screen.screen",
    "satmon.core.screen_state": "satmon.screen.state",
    "satmon.core.settings": "satmon.settings",
    "satmon.core.memory_plan": "satmon.probing.memory_plan",
    "satmon.writers": "satmon.io",
    "satmon.writers.tensorboard": "satmon.io.tensorboard",
    "satmon.writers.tensorboard_reader": "satmon.io.tensorboard_reader",
    "satmon.writers.tensorboard_replay": "satmon.io.tensorboard_replay",
    "satmon.writers.json_records": "satmon.io.json_records",
    "satmon.writers.markdown": "satmon.io.markdown",
    "satmon.integrations": "satmon.drivers",
    "satmon.integrations.hf": "satmon.drivers.hf",
}
#: 0.2 packages (their submodules are aliases too)
_PACKAGES = {"satmon.core", "satmon.writers", "satmon.integrations", "satmon.replay"}

#: (0.2 module, name) -> (0.3 module, name): names that moved between modules or were renamed.
#: ``satmon.probing``, ``satmon.replay`` and ``satmon.calibrate`` were modules in 0.2 and are packages
#: now: their 0.2 names that the package does not export are read from the modules that hold them.
NAMES: dict[tuple[str, str], tuple[str, str]] = {
    ("satmon.core.settings", "ScreenSettings"): ("satmon.settings", "Settings"),
    **{
        ("satmon.probing", n): ("satmon.probing.passes", n)
        for n in ("probe", "EMBEDDING", "LayerReading", "ProbeReport", "SigmaMinReading", "feed_first")
    },
    **{
        ("satmon.replay", n): ("satmon.replaying.loop", n) for n in ("TWIN_SEED", "nonfinite_parameters", "summary_row")
    },
    ("satmon.replay", "ReplayUsageError"): ("satmon.replaying.user_code", "ReplayUsageError"),
    **{
        ("satmon.calibrate", n): ("satmon.calibrate.fit", n)
        for n in ("STUDY_THRESHOLD", "FORMAT", "MIN_CELLS", "csv_rows", "to_float")
    },
    ("satmon.core.window_verdict", "verdict_stop_reason"): ("satmon.screen.stop_policy", "verdict_stop_reason"),
    **{
        ("satmon.discovery", n): ("satmon.model.map", n) for n in ("find_blocks", "find_dyt_layers", "find_norm_layers")
    },
}


#: (0.3 module, name) -> (its 0.4 home, name): names that moved in satmon 0.4, kept until satmon 0.6. The model
#: map's finders left ``satmon.model.discovery`` (they read the map, which reads discovery: an import circle).
MOVED_IN_0_4: dict[tuple[str, str], tuple[str, str]] = {
    **{
        ("satmon.model.discovery", n): ("satmon.model.map", n)
        for n in ("find_blocks", "find_dyt_layers", "find_norm_layers")
    },
}


#: satmon 0.4 module path -> its 0.5 home: the replay's package became ``satmon.replaying`` so that
#: ``satmon.replay`` is one thing, the function (as ``satmon.probe`` beside ``satmon.probing``); kept until satmon 0.6.
#: (and a pair of files with one name and two meanings: ``model/frozen.py``, the frozen forward, beside
#: ``results/frozen.py``, read-only containers)
MODULES_MOVED_IN_0_5: dict[str, str] = {
    "satmon.model.frozen": "satmon.model.frozen_forward",
    "satmon.io.known_cells": "satmon.results.forecast",  # the forecast's one home
    "satmon.drivers.run_scale": "satmon.drivers.counting",  # one name, one meaning: it counts parameters and tokens
    "satmon.results.run_scale": "satmon.results.scale",
    "satmon.replay": "satmon.replaying",
    **{
        f"satmon.replay.{m}": f"satmon.replaying.{m}"
        for m in ("budget", "checkpoints", "data", "live", "loop", "outputs", "session", "user_code")
    },
    "satmon.replay.dcp": "satmon.replaying.formats.dcp",
    "satmon.replay.reading": "satmon.replaying.formats.torch_file",
}

#: (0.4 module, name) -> (its 0.5 home, name): names that moved in satmon 0.5, kept until satmon 0.6. ``satmon``'s own
#: list (``satmon.__all__``) keeps the API a user calls; the mechanism under it is imported from its module; the
#: replay's names have one meaning each.
MOVED_IN_0_5: dict[tuple[str, str], tuple[str, str]] = {
    ("satmon", "build_verdict"): ("satmon.results.verdict", "build_verdict"),
    ("satmon", "LayerCounts"): ("satmon.results.verdict", "LayerCounts"),
    ("satmon", "Source"): ("satmon.results.verdict", "Source"),
    ("satmon", "GatingInfo"): ("satmon.results.gating", "GatingInfo"),
    ("satmon", "SaturationCounter"): ("satmon.observe.counters", "SaturationCounter"),
    ("satmon", "SaturationHooks"): ("satmon.observe.saturation", "SaturationHooks"),
    ("satmon.io.tensorboard", "TAG"): ("satmon.io.tags", "TAG"),
    ("satmon.io.tensorboard", "VERDICT_VALUES"): ("satmon.io.tags", "VERDICT_VALUES"),
    **{
        (m, "replay_checkpoints"): ("satmon.replaying.session", "replay")
        for m in ("satmon.replay", "satmon.replay.session")
    },
    **{
        (m, "Replay"): ("satmon.replaying.session", "ReplaySession") for m in ("satmon.replay", "satmon.replay.session")
    },
    **{(m, "replay"): ("satmon.replaying.loop", "checkpoint_records") for m in ("satmon.replay", "satmon.replay.loop")},
    **{("satmon.replay", n): ("satmon.replaying.loop", n) for n in ("ModelLoader", "ReplayRecord")},
    # the checkpoint formats got a module each; the listing its own
    **{
        (m, n): ("satmon.replaying.listing", n)
        for m in ("satmon.replay.checkpoints", "satmon.checkpoints")
        for n in ("Listing", "SATMON_FILES", "find_checkpoints", "list_checkpoints", "nothing_to_replay", "satmon_file")
    },
    **{
        (m, n): ("satmon.replaying.formats.hf_folder", n)
        for m in ("satmon.replay.checkpoints", "satmon.checkpoints")
        for n in ("HF_WEIGHTS", "TRAINER_STATE_FILES")
    },
    **{
        (m, "DCP_META"): ("satmon.replaying.formats.dcp", "DCP_META")
        for m in ("satmon.replay.checkpoints", "satmon.checkpoints")
    },
    **{
        (m, "unsupported_format"): ("satmon.replaying.formats.deepspeed", "unsupported_format")
        for m in ("satmon.replay.checkpoints", "satmon.checkpoints")
    },
    **{
        ("satmon.replay.reading", n): ("satmon.replaying.file_info", n)
        for n in ("CorruptFile", "FileChanged", "FileStamp")
    },
    ("satmon.replay.reading", "SafetensorsIndex"): ("satmon.replaying.formats.safetensors", "SafetensorsIndex"),
}


def deprecated(old: str, new: str, *, since: str = "0.5", until: str = "0.6", stacklevel: int = 3) -> None:
    """Warn that ``old`` (an argument, an attribute, a spelling) is deprecated for ``new``: one message for all.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     deprecated("Verdict.caveat", "Verdict.rule.caveat")
        >>> print(caught[0].message)
        Verdict.caveat is deprecated since satmon 0.5: use Verdict.rule.caveat (the old form works until satmon 0.6).
    """
    warnings.warn(
        f"{old} is deprecated since satmon {since}: use {new} (the old form works until satmon {until}).",
        SatmonDeprecationWarning,
        stacklevel=stacklevel,
    )


def _warn(old: str, new: str, stacklevel: int = 4, since: str = "0.3", until: str = REMOVED_IN) -> None:
    warnings.warn(
        f"{old} is deprecated since satmon {since}: use {new} (the old path works until satmon {until}).",
        SatmonDeprecationWarning,
        stacklevel=stacklevel,
    )


def moved_attribute(module: str, name: str) -> Any:
    """``module.name`` for a name that moved (with a warning), or the usual AttributeError.

    Example:
        >>> moved_attribute("satmon", "decide")
        Traceback (most recent call last):
        ...
        AttributeError: module 'satmon' has no attribute 'decide'
    """
    target = NAMES.get((module, name))
    if target is None and (module, name) in MOVED_IN_0_5:
        target = MOVED_IN_0_5[(module, name)]
        _warn(f"{module}.{name}", f"{target[0]}.{target[1]}", since="0.5", until="0.6")
        return getattr(importlib.import_module(target[0]), target[1])
    if target is None and (module, name) in MOVED_IN_0_4:
        target = MOVED_IN_0_4[(module, name)]
        _warn(f"{module}.{name}", f"{target[0]}.{target[1]}", since="0.4", until="0.6")
        return getattr(importlib.import_module(target[0]), target[1])
    if target is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{target[0]}.{target[1]}")
    return getattr(importlib.import_module(target[0]), target[1])


class _Alias(types.ModuleType):
    """A 0.2 module path: reads go to the module's 0.3 home (importing the path warned once)."""

    def __init__(self, old: str, new: str | None) -> None:
        super().__init__(old, f"Deprecated alias of {new or 'nothing'} (an old satmon path, with a warning).")
        self.__dict__["_new"] = new
        if old in _PACKAGES:
            self.__dict__["__path__"] = []  # submodules resolve through the finder

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        old, new = self.__name__, self.__dict__["_new"]
        if f"{old}.{name}" in MODULES or f"{old}.{name}" in MODULES_MOVED_IN_0_5:
            return importlib.import_module(f"{old}.{name}")
        if (old, name) in NAMES or (old, name) in MOVED_IN_0_4 or (old, name) in MOVED_IN_0_5:
            return moved_attribute(old, name)
        if new is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        return getattr(importlib.import_module(new), name)  # the import of this path already warned


class _CallableAlias(_Alias):
    """``satmon.replay`` imported as a module (a 0.4 path): importing it sets the attribute ``satmon.replay`` to this
    module, so calling it stays :func:`satmon.replay` (the function) for the rest of the process."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return importlib.import_module(self.__dict__["_new"] + ".session").replay(*args, **kwargs)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds 0.2 module paths (after the real modules: a path that exists is never shadowed)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES and fullname not in MODULES_MOVED_IN_0_5:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in _PACKAGES)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name in MODULES_MOVED_IN_0_5:
            new: str | None = MODULES_MOVED_IN_0_5[spec.name]
            _warn(spec.name, new, stacklevel=3, since="0.5", until="0.6")
        else:
            new = MODULES[spec.name]
            if new is not None:
                _warn(spec.name, new, stacklevel=3)  # _warn, this, then the importer (importlib's frames are skipped)
        return (_CallableAlias if spec.name == "satmon.replay" else _Alias)(spec.name, new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _RenamedFinder(_Finder):
    """Finds the 0.4 paths of a package renamed in 0.5 (``satmon.replay``), before any other finder: that package no
    longer exists, and a folder of it left behind (``satmon/replay/__pycache__`` after an upgrade in place, or an
    editable install of an older tree) must not be imported as an empty namespace package instead."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES_MOVED_IN_0_5:
            return None
        return super().find_spec(fullname, path, target)


_FINDER = _Finder()
_RENAMED = _RenamedFinder()


def install() -> None:
    """Let the 0.2 paths import (``import satmon`` calls it; idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    if _RENAMED not in sys.meta_path:
        sys.meta_path.insert(0, _RENAMED)
