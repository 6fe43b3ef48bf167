"""The run a replay reads, and that run's live verdict: where satmon finds it.

A replay compares its readings with the live window's verdict of the same run
(:class:`~satmon.results.live_replay.ReplaySource`). satmon looks, in this order:

1. ``--live RUN`` (:func:`live_from_tensorboard`): the TensorBoard run of the live training (a
   ``TensorBoardLogger`` version folder, or a folder above exactly one live run, or an event file);
2. the checkpoints themselves (:func:`live_from_checkpoints`): a Lightning checkpoint saved after the
   window closed holds :class:`satmon.SaturationMonitor`'s state, and its verdict whole;
3. the TensorBoard events in the run folder that holds the checkpoints (Lightning's
   ``version_N/checkpoints/`` layout: ``version_N``).

Nothing here runs code from a file: the checkpoints' indexes were read with
``torch.load(weights_only=True)`` (unless the user trusted them), and TensorBoard files hold data only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from satmon.replay.user_code import ReplayUsageError, printable
from satmon.results.live_replay import LiveReading, ReplaySource
from satmon.results.verdict import Source, Verdict
from satmon.screen.state import STATE_KEY

__all__ = ["find_source", "live_from_checkpoints", "live_from_tensorboard", "run_name", "source_run"]

_VERSION = re.compile(r"version_\d+")


def source_run(paths: Sequence[Path]) -> Path | None:
    """The run folder the checkpoints come from: their common folder, or the one above it when that is
    Lightning's ``checkpoints``; ``None`` without a path.

    Example:
        >>> source_run([Path("logs/demo/version_0/checkpoints/a.ckpt"), Path("logs/demo/version_0/checkpoints/b.ckpt")])
        PosixPath('logs/demo/version_0')
    """
    if not paths:
        return None
    folders = [p if p.is_dir() and not _is_hf_folder(p) else p.parent for p in paths]
    common = Path(*_common_parts([f.absolute().parts for f in folders]))
    if common.name == "checkpoints":
        common = common.parent
    try:
        return common.relative_to(Path.cwd())
    except ValueError:
        return common


def run_name(folder: Path | None) -> str | None:
    """The training run in ``folder`` (:func:`source_run`'s) as TensorBoard names runs: ``<experiment>/version_N``
    for Lightning's layout, else the folder's name when it holds a run's files (TensorBoard event files,
    ``hparams.yaml``); ``None`` for any other folder (checkpoints of several runs: their common folder). A replay's
    TensorBoard run is ``replay of`` this name.

    Example:
        >>> run_name(source_run([Path("satmon_logs/demo/version_0/checkpoints")])), run_name(source_run([Path("ckpts/a.ckpt")]))
        ('demo/version_0', None)
        >>> run_name(source_run([Path("a/version_1/checkpoints/x.ckpt"), Path("b/version_2/checkpoints")])) is None
        True
    """
    if folder is None:
        return None
    folder = Path(os.path.abspath(folder))
    if _VERSION.fullmatch(folder.name) and folder.parent.name:
        return f"{folder.parent.name}/{folder.name}"
    try:
        if folder.is_dir() and any(f.name.startswith("events.out.tfevents.") or f.name == "hparams.yaml"
                                   for f in folder.iterdir()):
            return folder.name
    except OSError:  # a folder this user cannot list: no name, the replay goes to LOGDIR/replay
        return None
    return None


def _is_hf_folder(path: Path) -> bool:
    return path.is_dir() and path.name.startswith("checkpoint-")


def _common_parts(parts: list[tuple[str, ...]]) -> tuple[str, ...]:
    common: list[str] = []
    for level in zip(*parts):
        if any(p != level[0] for p in level):
            break
        common.append(level[0])
    return tuple(common) or ("/",)


def _monitor_verdict(checkpoint: Any) -> Verdict | None:
    """The live window's verdict in a Lightning checkpoint's SaturationMonitor state, or ``None``."""
    states = checkpoint.get("callbacks") if isinstance(checkpoint, dict) else None
    if not isinstance(states, dict):
        return None
    for key, state in states.items():
        if isinstance(key, str) and key.startswith(STATE_KEY) and isinstance(state, dict) and isinstance(state.get("verdict"), dict):
            try:
                verdict = Verdict.from_dict(state["verdict"])
            except (KeyError, TypeError, ValueError):
                continue
            if verdict.source == Source.WINDOW.value:
                return verdict
    return None


def live_from_checkpoints(infos: Sequence[Any]) -> LiveReading | None:
    """The live verdict kept in the checkpoints' SaturationMonitor state: the one of the latest checkpoint
    holding one (every checkpoint saved after the window closed holds the same), or ``None``.

    ``infos`` are :class:`~satmon.replay.checkpoints.CheckpointInfo` whose index is still held (before the
    replay loop releases it).
    """
    found = [(info.global_step or 0, info, v) for info in infos
             if info.error is None and (v := _monitor_verdict(info.checkpoint)) is not None]
    if not found:
        return None
    _, info, verdict = max(found, key=lambda t: t[0])
    return LiveReading.from_verdict(verdict, found=f"the SaturationMonitor state saved in `{printable(info.path.name)}`")


_TRUST = re.compile(r"Trust: \*\*([a-z-]+)\*\*")
_WINDOW = re.compile(r"over a window of (\d+) optimizer steps")


def _reading_of(run: Any) -> LiveReading | None:
    """A TensorBoard run's live verdict (``Satmon/verdict`` and the card), or ``None`` (no verdict, or a replay)."""
    from satmon.io.tensorboard import TAG

    series = run.scalars.get(TAG.verdict)
    if not series or run.texts.get(TAG.replay_checkpoint) or run.texts.get(TAG.replay_error):
        return None
    decision, saturation = run.decision(), run.verdict_saturation()
    if decision is None or saturation is None:
        return None
    step = series[-1][0]
    margin = dict(run.scalars.get(TAG.margin, [])).get(step)
    card = run.last_text(TAG.verdict_text) or ""
    if card and "over a window of" not in card:  # a probe's verdict, not a live window's
        return None
    trust, window = _TRUST.search(card), _WINDOW.search(card)
    return LiveReading(decision=decision, saturation=float(saturation),
                       threshold=float(saturation - margin) if margin is not None else float("nan"), step=int(step),
                       window=int(window.group(1)) if window else None, trust=trust.group(1) if trust else None,
                       found=f"the TensorBoard events in `{printable(str(run.path))}`")


def live_from_tensorboard(path: str | Path, explicit: bool = True) -> LiveReading | None:
    """The live verdict in the TensorBoard run at ``path`` (a run folder, a folder above one live run, or an
    event file).

    Raises:
        ReplayUsageError: ``explicit`` (``--live``) and ``path`` is missing, holds no live verdict, or holds
            several live runs (the message lists them: pass one).
    """
    from satmon.io.tensorboard_reader import EVENT_GLOB, load_runs, read_run

    path = Path(path)
    if explicit and not path.exists():
        raise ReplayUsageError(f"--live {str(path)!r}: no such file or folder. Pass the live run's TensorBoard folder "
                               "(e.g. satmon_logs/demo/version_0).")
    if not explicit:  # the folder above the checkpoints: its own event files only, not every run below it
        if not path.is_dir() or not any(path.glob(EVENT_GLOB)):
            return None
        runs = [read_run(path)]
    else:
        try:
            runs, _ = load_runs(path)
        except OSError as e:
            raise ReplayUsageError(f"--live {str(path)!r}: cannot read it: {e.strerror or e}.") from None
    readings = [(run, r) for run in runs if (r := _reading_of(run)) is not None]
    if not explicit:
        return readings[0][1] if readings else None
    if not readings:
        raise ReplayUsageError(f"--live {str(path)!r}: no live satmon verdict there (no Satmon/verdict of a screening "
                               "window in its TensorBoard events). Pass the folder a TensorBoardLogger wrote for the run "
                               "SaturationMonitor screened, or leave --live out.")
    if len(readings) > 1:
        names = ", ".join(printable(str(run.path)) for run, _ in readings[:5])
        raise ReplayUsageError(f"--live {str(path)!r}: {len(readings)} live runs there ({names}{', ...' if len(readings) > 5 else ''}); "
                               "pass the one these checkpoints come from.")
    return readings[0][1]


def find_source(run: Path | None, infos: Sequence[Any], live: str | os.PathLike | None = None) -> ReplaySource:
    """The run the checkpoints come from and its live verdict: ``--live`` first, then satmon's state saved with the
    checkpoints, then the TensorBoard events of the run folder (see the module docstring).

    Args:
        run: the run folder (:func:`source_run` of the paths replayed: computed once, by the caller).
        infos: the inspected checkpoints (their index still held).
        live: the live run's TensorBoard folder, when the user named it.

    Raises:
        ReplayUsageError: from :func:`live_from_tensorboard` for a ``--live`` that cannot be read.
    """
    if live is not None:
        reading = live_from_tensorboard(live, explicit=True)
        return ReplaySource(run=printable(os.fspath(live)), live=reading)
    name = printable(str(run)) if run is not None else "?"
    reading = live_from_checkpoints(infos)
    if reading is None and run is not None:
        try:
            reading = live_from_tensorboard(run, explicit=False)
        except OSError:
            reading = None
    if reading is not None:
        return ReplaySource(run=name, live=reading)
    return ReplaySource(run=name, missing="no satmon state with a verdict saved with the checkpoints and no satmon "
                                          "verdict in TensorBoard events beside them; pass --live RUN (the live run's "
                                          "TensorBoard folder) to compare")
