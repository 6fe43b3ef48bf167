"""Read satmon runs back from TensorBoard event files: the inverse of :mod:`satmon.io.tensorboard`.

Scalars come back as ``(step, value)`` trajectories and texts as ``(step, markdown)``, keyed by the
:class:`~satmon.io.tags.TAG` names they were written under (``satmon report`` prints
them; a browserless machine reads a run this way). Runs of satmon 0.2, which wrote its scalars under
``satmon/`` and its texts under ``<tag>/text_summary``, come back under the same names
(:meth:`~satmon.io.tags.TAG.read_name`).

Event files are read as hostile input (:func:`event_records`): a file is opened without blocking and read only
when it is a regular file (a FIFO named like an event file would block ``open`` forever, a device would be read
forever); each record's length is checked against its CRC and against what is left of the file before anything is
allocated (a record claiming a terabyte is a damaged file, not a ``MemoryError``); each record's data against its
CRC. Reading a file stops at its first damaged record, keeping what came before, and :attr:`Run.problems` says
where. Tags and texts come back with their control characters escaped (:func:`~satmon.io.safe_text.printable`):
nothing read from a file can drive the terminal it is printed on.
"""

from __future__ import annotations

import math
import os
import struct
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from satmon.io.safe_text import printable
from satmon.io.tags import TAG, V02_TEXT_SUFFIX, VERDICT_VALUES
from satmon.paths import NotRegular, kind_of, open_regular

__all__ = [
    "EVENT_GLOB",
    "MAX_RECORD",
    "DamagedEvents",
    "Run",
    "event_records",
    "load_runs",
    "read_run",
    "run_dirs",
    "trajectory",
    "TEXT_SUFFIX",
]

#: TensorBoard's event files, by name.
EVENT_GLOB = "events.out.tfevents.*"
#: The longest event record read (satmon's records are a few KB; TensorBoard's own images rarely pass a few MB).
MAX_RECORD = 64 << 20
#: ``SummaryWriter.add_text(tag, ...)`` stores the text under ``tag + TEXT_SUFFIX`` (satmon 0.2's
#: texts; 0.3 writes under ``tag``).
TEXT_SUFFIX = V02_TEXT_SUFFIX  # the one definition is the tag table's (TAG.from_v02)
#: Per-layer scalar families: tag prefix -> the reading's name in :meth:`Run.layers`.
_LAYER_FAMILIES = {TAG.layer_saturation(""): "saturation", TAG.alpha(""): "alpha", TAG.init_gap(""): "init_gap"}
_DEADIR = TAG.deadir_alignment("").removesuffix("/alignment")  # "satmon_deadir/": then <layer>/<reading>


@dataclass
class Run:
    """The satmon content of one TensorBoard run folder.

    Attributes:
        path: the run folder.
        scalars: tag -> ``[(step, value)]`` in step order (see :func:`trajectory`).
        texts: tag (without 0.2's ``/text_summary``) -> ``[(step, text)]`` in write order.
        problems: the event files that were not read to their end (not regular files, damaged records), and why.
        hparams: the hyper-parameters of the run's hparams sessions (``satmon/decision``, ``satmon/trust``,
            ``satmon/window``, ``satmon/threshold``...: :func:`satmon.io.tensorboard.verdict_hparams`), a later
            session's value replacing an earlier one's; ``hparams_step``: the step of the last session with satmon's.
    """

    path: Path
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    texts: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    hparams_step: int | None = None
    problems: list[str] = field(default_factory=list)  #: event files not read to their end, and why

    def steps(self) -> list[int]:
        """Every step any satmon scalar was written at, sorted."""
        return sorted({s for series in self.scalars.values() for s, _ in series})

    def last_text(self, tag: str) -> str | None:
        """The last text written under ``tag`` (e.g. ``TAG.verdict_text``: the latest verdict card), or ``None``."""
        texts = self.texts.get(tag)
        return texts[-1][1] if texts else None

    def decision(self) -> str | None:
        """The last verdict's decision (``"go"``, ``"no-go"``, ``"non-finite"``) from ``Satmon/decision``, or ``None``.

        Example:
            >>> Run(Path("."), scalars={TAG.verdict: [(7, -1.0)]}).decision()
            'non-finite'
        """
        series = self.scalars.get(TAG.verdict)
        if not series:
            return None
        return {v: k for k, v in VERDICT_VALUES.items()}.get(series[-1][1])

    def verdict_saturation(self) -> float | None:
        """The pooled saturation written with the last verdict (``Satmon/saturation`` at its step), or ``None``."""
        series = self.scalars.get(TAG.verdict)
        return dict(self.scalars.get(TAG.saturation, [])).get(series[-1][0]) if series else None

    def layers(self) -> dict[str, dict[str, float]]:
        """layer -> {reading: last value}: saturation, alpha, init_gap and the dead-direction readings.

        Example:
            >>> scalars = {TAG.alpha("ln_f"): [(2, 1.5), (4, 1.25)], TAG.deadir_null_dim("h.0.ln_1"): [(4, 0.0)]}
            >>> run = Run(Path("."), scalars=scalars)
            >>> run.layers()
            {'ln_f': {'alpha': 1.25}, 'h.0.ln_1': {'null_dim': 0.0}}
        """
        layers: dict[str, dict[str, float]] = defaultdict(dict)
        for tag, series in self.scalars.items():
            for prefix, reading in _LAYER_FAMILIES.items():
                rest = tag[len(prefix) :]
                if tag.startswith(prefix) and rest and "/" not in rest:
                    layers[rest][reading] = series[-1][1]
            if tag.startswith(_DEADIR) and tag.count("/") > _DEADIR.count("/"):
                layer, reading = tag[len(_DEADIR) :].rsplit("/", 1)
                layers[layer][reading] = series[-1][1]
        return dict(layers)

    def sigma_min_min_ratio(self) -> list[tuple[int, float]]:
        """The residual stream's sigma_min ratio, minimum over depth, per step (written, or taken over the blocks)."""
        if TAG.sigma_min_min_ratio in self.scalars:
            return self.scalars[TAG.sigma_min_min_ratio]
        by_step: dict[int, float] = {}
        for tag, series in self.scalars.items():
            if tag.startswith(TAG.sigma_min_ratio("")):
                for s, v in series:
                    by_step[s] = min(by_step.get(s, math.inf), v)
        return sorted(by_step.items())


def trajectory(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Points in step order, the last write of a step winning.

    A step-0 point written after later steps is dropped: it is a copy of the metric for the hparams
    view (Lightning's ``log_hyperparams(metrics=...)``, which v0.1 used, logs it at step 0), not a
    reading taken at step 0.

    Example:
        >>> trajectory([(2, 0.1), (4, 0.2), (4, 0.3), (0, 0.3)])
        [(2, 0.1), (4, 0.3)]
    """
    kept: dict[int, float] = {}
    top = -1
    for step, value in points:
        if step == 0 and top > 0:
            continue
        kept[step] = value
        top = max(top, step)
    return sorted(kept.items())


def run_dirs(root: str | Path) -> list[Path]:
    """Run folders under ``root`` (or the folder of an event file): those holding event files, without
    the hparams sub-runs (their parent run holds the same readings) unless nothing else is there."""
    root = Path(root)
    if root.is_file():
        return [root.parent]
    dirs = sorted({f.parent for f in root.rglob(EVENT_GLOB)})
    return [d for d in dirs if d.name != TAG.hparams_run] or dirs


class DamagedEvents(ValueError):
    """An event file that cannot be read on from here (the message says where and why)."""


def event_records(path: str | Path, max_record: int = MAX_RECORD) -> Iterator[bytes]:
    """The records of a TensorBoard event file (TFRecord framing: length, its masked CRC-32C, data, its CRC).

    The file is opened without blocking and read only if it is a regular file; a record's length is checked against
    its CRC, :data:`MAX_RECORD` and the bytes left in the file before it is read; its data against its CRC.

    Raises:
        DamagedEvents: not a regular file, or a damaged or cut-short record (the records before it were yielded).
        OSError: the file cannot be opened or read.
    """
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    kind = kind_of(path)  # by lstat/stat first: a FIFO, a socket, a device or a link to one is named, never opened
    if not kind.regular:
        raise DamagedEvents(f"not a regular file: {kind.describe()}; not read")
    try:
        fd = open_regular(path)  # and checked again once open: a FIFO put at the name since is not read
    except NotRegular as e:
        raise DamagedEvents(f"not a regular file: {e.kind.describe()}; not read") from None
    st = os.fstat(fd)
    with os.fdopen(fd, "rb") as f:
        size, at = st.st_size, 0
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise DamagedEvents(f"cut short at byte {at:,} (a record header of {len(head)} bytes)")
            (length,), (crc,) = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])
            if masked_crc32c(head[:8]) != crc:
                raise DamagedEvents(f"damaged at byte {at:,} (a record length that fails its CRC)")
            if length > min(max_record, size - at - 16):
                raise DamagedEvents(
                    f"damaged at byte {at:,} (a record of {length:,} bytes, where at most "
                    f"{min(max_record, max(size - at - 16, 0)):,} can be: larger than the file or "
                    f"{max_record:,} bytes)"
                )
            data, tail = f.read(length), f.read(4)
            if len(data) < length or len(tail) < 4:
                raise DamagedEvents(f"cut short at byte {at:,} (a record of {length:,} bytes)")
            if masked_crc32c(data) != struct.unpack("<I", tail)[0]:
                raise DamagedEvents(f"damaged at byte {at:,} (a record that fails its CRC)")
            at += 16 + length
            yield data


def _text(tensor) -> str:
    return printable(b"\n".join(tensor.string_val).decode("utf-8", "replace"), keep="\n\t")


def _scalar(tensor) -> float | None:
    """A scalar tensor's value, read from the proto as it is (its shape is never expanded: a crafted shape claiming
    10^12 elements allocates nothing); ``None`` for anything but one float."""
    if any(d.size != 1 for d in tensor.tensor_shape.dim):
        return None
    if tensor.float_val or tensor.double_val:
        return float((tensor.float_val or tensor.double_val)[0])
    formats = {1: "<f", 2: "<d"}  # DT_FLOAT, DT_DOUBLE
    fmt = formats.get(tensor.dtype)
    if fmt is not None and len(tensor.tensor_content) == struct.calcsize(fmt):
        return float(struct.unpack(fmt, tensor.tensor_content)[0])
    return None


def _read_hparams(run: Run, content: bytes, step: int) -> None:
    """One hparams session's start (its hyper-parameters, as data) into ``run.hparams``; other hparams records
    (the experiment, a session's end) and damaged ones are left out."""
    from google.protobuf.message import DecodeError
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    try:
        data = HParamsPluginData.FromString(content)
    except DecodeError:
        return
    if not data.HasField("session_start_info"):
        return
    found = {}
    for key, value in data.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        if kind in ("number_value", "string_value", "bool_value"):
            found[printable(key)] = printable(value.string_value) if kind == "string_value" else getattr(value, kind)
    run.hparams.update(found)
    if TAG.hp_decision in found:  # a session of satmon's verdict
        run.hparams_step = int(step)


def read_run(path: str | Path) -> Run:
    """The satmon scalars and texts of one run folder (every event file in it, in name order).

    Only regular files are read, each to its first damaged record (:func:`event_records`); :attr:`Run.problems`
    names the others. Tags and texts come back with their control characters escaped.
    """
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    run = Run(path=Path(path))
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    plugins: dict[str, str] = {}  # tag -> plugin, from its first value that names one (as TensorBoard reads it)
    for file in sorted(Path(path).glob(EVENT_GLOB)):
        try:
            for record in event_records(file):
                event = event_pb2.Event.FromString(record)
                for v in event.summary.value:
                    tag = printable(v.tag)
                    if v.metadata.plugin_data.plugin_name and tag not in plugins:
                        plugins[tag] = v.metadata.plugin_data.plugin_name
                    kind = v.WhichOneof("value")
                    if kind == "simple_value" or (kind == "tensor" and plugins.get(tag) == "scalars"):
                        name = TAG.read_name(tag)
                        value = v.simple_value if kind == "simple_value" else _scalar(v.tensor)
                        if name is not None and value is not None:  # a 0.2 run's tags by their 0.3 names: one series
                            points[name].append((event.step, float(value)))
                    elif v.metadata.plugin_data.plugin_name == "hparams":
                        _read_hparams(run, v.metadata.plugin_data.content, event.step)
                    elif kind == "tensor" and plugins.get(tag) == "text":
                        name = TAG.read_name(tag, text=True)
                        if name is not None:
                            run.texts.setdefault(name, []).append((event.step, _text(v.tensor)))
        except (DamagedEvents, DecodeError) as e:
            why = (
                printable(str(e))
                if isinstance(e, DamagedEvents)
                else f"a record that is not an event ({type(e).__name__})"
            )
            kept = "" if why.startswith("not a regular file") else "; the records before it were read"
            run.problems.append(f"{printable(file.name)}: {why}{kept}")
        except OSError as e:  # this user cannot read it: the other files are still read
            run.problems.append(f"{printable(file.name)}: cannot read it: {printable(e.strerror or str(e))}")
    run.scalars = {name: trajectory(p) for name, p in points.items()}
    return run


def load_runs(root: str | Path) -> tuple[list[Run], int]:
    """Every run folder under ``root`` with satmon tags, and how many run folders were looked at.

    Example:
        >>> import tempfile
        >>> load_runs(tempfile.mkdtemp())
        ([], 0)
    """
    dirs = run_dirs(root)
    runs = [run for run in map(read_run, dirs) if run.scalars or run.texts]
    return runs, len(dirs)
