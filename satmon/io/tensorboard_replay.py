"""Write a replay to TensorBoard: each checkpoint at its global step, with the live callback's tags.

The tags and the reading -> tag maps are :mod:`satmon.io.tensorboard`'s, and the files are written
by its :class:`~satmon.io.tensorboard.SummaryWriterSink`, so a replayed run opens beside the live
one and the curves line up. A replay of a run's checkpoints is named for that run
(``replay of demo/version_0``: :func:`satmon.replaying.live.run_name`), writes its checkpoint names after the card in
the Text tab, and gives the HParams tab one session, its last checkpoint's, without a column list of
its own (the live runs' columns, with their models' hyper-parameters, stay).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from satmon.io.tags import TAG
from satmon.io.tensorboard import (
    SummaryWriterSink,
    add_layout,
    log_scalars,
    log_text,
    log_verdict,
    probe_scalars,
    verdict_hparams,
    verdict_scalars,
)

__all__ = ["LazyTensorBoardReplay", "TensorBoardReplay", "claim_run_folder", "next_version"]


def next_version(root: str | os.PathLike) -> int:
    """The next ``version_N`` under ``root``: one more than the highest there, 0 when there is none
    (the numbering of Lightning's ``TensorBoardLogger``, so replays and live runs share a folder; a file named
    ``version_N`` counts too, so the run folder never lands on it).

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> os.makedirs(os.path.join(root, "version_3")); next_version(root), next_version(os.path.join(root, "none"))
        (4, 0)
    """
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    found = [int(n.split("_")[1]) for n in names if n.startswith("version_") and n.split("_")[1].isdigit()]
    return max(found) + 1 if found else 0


def claim_run_folder(logdir: str | os.PathLike, name: str = "replay", source: str | None = None) -> str:
    """Make and return a run folder no other process writes: ``logdir/replay of SOURCE`` (then ``... (2)``, ...)
    with ``source``, else ``logdir/name/version_N`` (:func:`next_version`).

    The folder is claimed by ``os.mkdir``, which exactly one process wins: two replays started together into the
    same ``logdir`` and ``name`` get two runs (``version_0`` and ``version_1``), never one run with both replays'
    events mixed.

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> [os.path.relpath(claim_run_folder(root), root) for _ in range(2)]
        ['replay/version_0', 'replay/version_1']
        >>> [os.path.relpath(claim_run_folder(root, source="demo/version_0"), root) for _ in range(2)]
        ['replay of demo/version_0', 'replay of demo/version_0 (2)']
    """
    logdir = os.fspath(logdir)  # literally: no ~ or $VAR expansion (the caller checked this path)
    for _ in range(10_000):
        if source:
            base = os.path.join(logdir, f"replay of {source}")
            run, n = base, 1
            while os.path.lexists(run):
                n += 1
                run = f"{base} ({n})"
        else:
            root = os.path.join(logdir, name)
            run = os.path.join(root, f"version_{next_version(root)}")
        os.makedirs(os.path.dirname(run), exist_ok=True)
        try:
            os.mkdir(run)
        except FileExistsError:  # another process took it between the listing and the mkdir: the next one
            continue
        return run
    raise FileExistsError(
        f"Expected a free run folder under {logdir!r}, got 10000 taken: pass another --name or --logdir."
    )


class TensorBoardReplay:
    """A TensorBoard run of replayed checkpoints; pass it as
    ``satmon.replaying.loop.checkpoint_records(on_record=...)``.

    Args:
        logdir: the TensorBoard root.
        name: the run name, when ``source`` is not given: the run goes to
            ``logdir/name/version_N`` (:func:`next_version`).
        source: the run the checkpoints are of (:func:`satmon.replaying.live.run_name`): the run goes to
            ``logdir/replay of SOURCE`` (``replay of SOURCE (2)``, ... when that exists), so TensorBoard
            lists it as the replay of that run.

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> tb = TensorBoardReplay(root)
        >>> tb.log_dir.endswith("version_0")
        True
        >>> tb.close()
        >>> os.path.relpath(TensorBoardReplay(root, source="demo/version_0").log_dir, root)
        'replay of demo/version_0'
    """

    def __init__(self, logdir: str | Path, name: str = "replay", source: str | None = None) -> None:
        run = claim_run_folder(logdir, name, source)  # one writer per run folder
        # no column list of its own in the HParams tab: the live runs' stay (satmon.io.tensorboard.hparams_summaries)
        self.sink = SummaryWriterSink(run, hparams_experiment=False)
        self._layout = False
        self._last: Any = None  # the verdict of the highest step so far: the run's one hparams session

    @property
    def log_dir(self) -> str:
        return self.sink.log_dir

    def __call__(self, record: Any) -> None:
        """Write one :class:`satmon.replaying.loop.ReplayRecord`: its readings and verdict (its card names the source
        run and, when found, shows its live verdict beside this one), or why it was skipped."""
        step = int(record.global_step or 0)
        report = record.report
        if report is None:
            log_text(self.sink, TAG.replay_error, f"`{record.checkpoint}`: {record.error}", step)
            return
        if not self._layout:
            if any(layer.kind == "dyt" for layer in report.layers.values()):
                add_layout(self.sink)
            self._layout = True
        scalars = probe_scalars(report)
        if report.verdict is not None:
            scalars.pop(TAG.saturation, None)  # log_verdict writes the pooled saturation itself: once per step
        log_scalars(self.sink, scalars, step)
        if report.verdict is not None:
            # a ReplayRecord's: the source run and its live verdict beside this one
            card = getattr(record, "card", None)
            log_verdict(self.sink, report.verdict, hparams=False, card=card() if callable(card) else None)
            if self._last is None or report.verdict.step >= self._last.step:
                self._last = report.verdict
        log_text(self.sink, TAG.replay_checkpoint, f"`{record.checkpoint}`", step)

    def close(self) -> None:
        """Write the hparams session (TensorBoard keeps a run's first: the last checkpoint's verdict, once), then
        flush and close the run's files."""
        if self._last is not None:
            v, self._last = self._last, None
            self.sink.hparams(verdict_hparams(v), verdict_scalars(v), v.step)
        self.sink.close()


class LazyTensorBoardReplay:
    """A :class:`TensorBoardReplay` made at the first record: a replay refused or interrupted before any work leaves
    no run, and neither does one where no checkpoint could be read (``enabled=False``).

    Example:
        >>> import tempfile
        >>> tb = LazyTensorBoardReplay(tempfile.mkdtemp(), "replay")
        >>> tb.log_dir is None  # nothing written yet
        True
        >>> tb.close()
    """

    def __init__(
        self, logdir: str | os.PathLike, name: str = "replay", enabled: bool = True, source: str | None = None
    ) -> None:
        self.logdir, self.name, self.enabled, self.source = logdir, name, enabled, source
        self.writer: TensorBoardReplay | None = None

    def __call__(self, record: Any) -> None:
        if not self.enabled:
            return
        if self.writer is None:
            self.writer = TensorBoardReplay(self.logdir, name=self.name, source=self.source)
        self.writer(record)

    @property
    def log_dir(self) -> Path | None:
        """The run folder (resolved), ``None`` before the first record."""
        return None if self.writer is None else Path(self.writer.log_dir).resolve()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
