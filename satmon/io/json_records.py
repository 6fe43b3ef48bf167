"""Write replay records as JSON: a ``.jsonl`` file gets one record a line, any other name one JSON array.

:func:`to_json` is satmon's one JSON sanitiser (the probe report, replay records): non-finite floats
become ``null`` (strict JSON has no NaN/inf), tensors and numpy values numbers or lists. The file is
replaced atomically, so a reader never sees half a file and an interrupted replay keeps the records
written so far (:mod:`satmon.io.atomic`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from satmon.io.atomic import atomic_write

__all__ = ["to_json", "write_records"]


def to_json(obj: Any) -> Any:
    """A strictly JSON-serialisable copy of ``obj``: the one sanitiser of everything satmon writes as JSON.

    NaN/inf become ``None``; tensors and numpy values Python numbers or lists; enums their value;
    objects with ``to_dict`` (satmon's results) and other dataclasses a dict; tuples and sets lists;
    anything else (paths...) its ``str``.

    Example:
        >>> to_json({"a": float("nan"), "b": (1, 2.5), "c": Path("x.ckpt")})
        {'a': None, 'b': [1, 2.5], 'c': 'x.ckpt'}
    """
    if isinstance(obj, Enum):  # before str/int: StopReason and Source are str enums
        return to_json(obj.value)
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, (int, str)):
        return int(obj) if isinstance(obj, int) else str(obj)
    if isinstance(obj, float):  # numpy.float64 is a float: made a plain one
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_json(v) for v in obj]
    if hasattr(obj, "tolist"):  # torch tensors, numpy arrays and scalars
        return to_json(obj.tolist())
    if hasattr(obj, "to_dict"):
        return to_json(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # shallow: fields go through to_json, not deepcopy
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return str(obj)


def write_records(path: str | Path, records: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``records`` to ``path`` (``.jsonl``: one a line; otherwise an indented JSON array).

    The whole file is replaced in one rename (:func:`satmon.io.atomic.atomic_write`): an interrupt or a
    crash during the write leaves the previous file as it was, never a partial one. Check the path
    with :func:`satmon.io.atomic.check_output` before any work.

    Example:
        >>> import tempfile, pathlib
        >>> p = write_records(pathlib.Path(tempfile.mkdtemp()) / "r.jsonl", [{"step": 1, "s": float("nan")}])
        >>> p.read_text()
        '{"step": 1, "s": null}\\n'
    """
    path = Path(path)
    clean = [to_json(r) for r in records]
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in clean)
    else:
        text = json.dumps(clean, indent=1, allow_nan=False) + "\n"
    atomic_write(path, text)
    return path
