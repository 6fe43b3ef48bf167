"""Read satmon runs back from TensorBoard event files: the inverse of :mod:`satmon.io.tensorboard`.

Scalars come back as ``(step, value)`` trajectories and texts as ``(step, markdown)``, keyed by the
:class:`~satmon.io.tensorboard.TAG` names they were written under (``satmon report`` prints
them; a browserless machine reads a run this way). Runs of satmon 0.2, which wrote its scalars under
``satmon/`` and its texts under ``<tag>/text_summary``, come back under the same names
(:meth:`~satmon.io.tensorboard.TAG.read_name`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from satmon.io.tensorboard import _V02_TEXT_SUFFIX, TAG, VERDICT_VALUES

__all__ = ["EVENT_GLOB", "Run", "load_runs", "read_run", "run_dirs", "trajectory", "TEXT_SUFFIX"]

#: TensorBoard's event files, by name.
EVENT_GLOB = "events.out.tfevents.*"
#: ``SummaryWriter.add_text(tag, ...)`` stores the text under ``tag + TEXT_SUFFIX`` (satmon 0.2's texts; 0.3 writes under ``tag``).
TEXT_SUFFIX = _V02_TEXT_SUFFIX  # the one definition is the tag table's (TAG.from_v02)
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
    """

    path: Path
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    texts: dict[str, list[tuple[int, str]]] = field(default_factory=dict)

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
            >>> run = Run(Path("."), scalars={TAG.alpha("ln_f"): [(2, 1.5), (4, 1.25)], TAG.deadir_null_dim("h.0.ln_1"): [(4, 0.0)]})
            >>> run.layers()
            {'ln_f': {'alpha': 1.25}, 'h.0.ln_1': {'null_dim': 0.0}}
        """
        layers: dict[str, dict[str, float]] = defaultdict(dict)
        for tag, series in self.scalars.items():
            for prefix, reading in _LAYER_FAMILIES.items():
                rest = tag[len(prefix):]
                if tag.startswith(prefix) and rest and "/" not in rest:
                    layers[rest][reading] = series[-1][1]
            if tag.startswith(_DEADIR) and tag.count("/") > _DEADIR.count("/"):
                layer, reading = tag[len(_DEADIR):].rsplit("/", 1)
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


def read_run(path: str | Path) -> Run:
    """The satmon scalars and texts of one run folder (every event file in it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})  # 0: keep every event
    acc.Reload()
    tags = acc.Tags()
    run = Run(path=Path(path))
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for tag in tags.get("scalars", []):
        name = TAG.read_name(tag)
        if name is not None:  # an older run's tags by today's names (a run both wrote: one series)
            points[name] += [(e.step, float(e.value)) for e in acc.Scalars(tag)]
    for tag in tags.get("tensors", []):  # scalars in the scalar plugin's tensor form (a described tag: the decision)
        name = TAG.read_name(tag)
        if name is not None and acc.SummaryMetadata(tag).plugin_data.plugin_name == "scalars":
            points[name] += [(e.step, float(tensor_util.make_ndarray(e.tensor_proto).item())) for e in acc.Tensors(tag)]
    run.scalars = {name: trajectory(p) for name, p in points.items()}
    for tag in tags.get("tensors", []):
        name = TAG.read_name(tag, text=True)
        if name is not None and acc.SummaryMetadata(tag).plugin_data.plugin_name == "text":
            texts = []
            for e in acc.Tensors(tag):
                value = tensor_util.make_ndarray(e.tensor_proto).reshape(-1)
                texts.append((e.step, b"\n".join(v if isinstance(v, bytes) else str(v).encode() for v in value).decode()))
            run.texts[name] = run.texts.get(name, []) + texts
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
