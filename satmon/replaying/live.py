"""The run a replay reads, and that run's live verdict: where satmon finds it.

A replay compares its readings with the live window's verdict of the same run
(:class:`~satmon.results.live_replay.ReplaySource`). satmon looks, in this order:

1. ``--live RUN`` (:func:`live_from_tensorboard`): the TensorBoard run of the live training (a
   ``TensorBoardLogger`` version folder, or a folder above exactly one live run, or an event file);
2. satmon's state saved with the checkpoints (:func:`live_from_checkpoints`): a Lightning checkpoint saved
   after the window closed holds :class:`satmon.SaturationMonitor`'s state, and its verdict whole; a Hugging
   Face ``checkpoint-N`` folder holds the callback's ``satmon_state.pt``, with the same verdict;
3. the TensorBoard events in the run folder that holds the checkpoints (Lightning's
   ``version_N/checkpoints/`` layout: ``version_N``), or, for a Hugging Face ``output_dir``, the one live run
   under its ``runs/`` (the Trainer's ``runs/<date>_<host>``).

Everything is read as data: the verdict's own fields (:meth:`~satmon.results.verdict.Verdict.from_dict`), or the
hparams session the live run wrote (decision, trust, source, window, threshold) and its pooled-saturation scalar.
The card is rendered from data and never parsed. Nothing here runs code from a file: the checkpoints' indexes were
read with ``torch.load(weights_only=True)`` (unless the user trusted them), satmon's state file too, and
TensorBoard files hold data only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from satmon.replaying.user_code import ReplayUsageError, printable
from satmon.results.live_replay import LiveReading, ReplaySource
from satmon.results.verdict import Source, Verdict
from satmon.screen.state import STATE_FILE, STATE_KEY

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
    folders = [p if os.path.isdir(p) and not _is_hf_folder(p) else p.parent for p in paths]  # False past PATH_MAX
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
        >>> lightning, plain = Path("satmon_logs/demo/version_0/checkpoints"), Path("ckpts/a.ckpt")
        >>> run_name(source_run([lightning])), run_name(source_run([plain]))
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
        if folder.is_dir() and any(
            f.name.startswith("events.out.tfevents.") or f.name == "hparams.yaml" for f in folder.iterdir()
        ):
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
        if isinstance(key, str) and key.startswith(STATE_KEY) and isinstance(state, dict):
            verdict = _window_verdict(state.get("verdict"))
            if verdict is not None:
                return verdict
    return None


#: The most bytes of a ``satmon_state.pt`` read for the live verdict (the screen's state is counts: a few kB a layer).
MAX_STATE_BYTES = 64 << 20


def _hf_state_verdict(folder: Path) -> Verdict | None:
    """The live window's verdict in the screen state the Hugging Face callback saved in a ``checkpoint-N`` folder
    (:data:`~satmon.screen.state.STATE_FILE`, read with ``torch.load(weights_only=True)``), or ``None``."""
    path = folder / STATE_FILE
    try:
        if not path.is_file() or path.stat().st_size > MAX_STATE_BYTES:  # a FIFO, a device, a bomb: not read
            return None
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # damaged, or not satmon's: no live verdict from it
        return None
    return _window_verdict(state.get("verdict") if isinstance(state, dict) else None)


def _window_verdict(saved: Any) -> Verdict | None:
    if not isinstance(saved, dict):
        return None
    try:
        verdict = Verdict.from_dict(saved)
    except (KeyError, TypeError, ValueError):
        return None
    return verdict if verdict.source == Source.WINDOW.value else None


def live_from_checkpoints(infos: Sequence[Any]) -> LiveReading | None:
    """The live verdict kept in satmon's state saved with the checkpoints: a Lightning checkpoint's SaturationMonitor
    state, or the ``satmon_state.pt`` of a Hugging Face ``checkpoint-N`` folder; the one of the latest checkpoint
    holding one (every checkpoint saved after the window closed holds the same), or ``None``.

    ``infos`` are :class:`~satmon.replaying.checkpoints.CheckpointInfo` whose index is still held (before the
    replay loop releases it).
    """
    found = []
    for info in infos:
        if info.error is not None:
            continue
        hf = bool(getattr(info, "hf", False)) and Path(info.path).is_dir()
        verdict = _hf_state_verdict(Path(info.path)) if hf else _monitor_verdict(info.checkpoint)
        if verdict is not None:
            found.append((info.global_step or 0, info, verdict, hf))
    if not found:
        return None
    _, info, verdict, hf = max(found, key=lambda t: t[0])
    where = (
        f"satmon's state saved in `{printable(info.path.name)}/{STATE_FILE}`"
        if hf
        else f"the SaturationMonitor state saved in `{printable(info.path.name)}`"
    )
    return LiveReading.from_verdict(verdict, found=where)


def _reading_of(run: Any) -> LiveReading | None:
    """A TensorBoard run's live verdict, read from what the live run wrote as data: the hparams session
    (:func:`satmon.io.tensorboard.verdict_hparams`: decision, trust, source, window, threshold) and the pooled
    saturation scalar at the session's step. ``None`` when the run holds no satmon session of a screening window (a
    probe's or a replay's verdict, or a run without satmon's hyper-parameters). The card is never parsed."""
    from satmon.io.tags import TAG, VERDICT_VALUES

    if run.texts.get(TAG.replay_checkpoint) or run.texts.get(TAG.replay_error):  # a replay's run
        return None
    hp, step = run.hparams, run.hparams_step
    if hp.get(TAG.hp_source) != Source.WINDOW.value or hp.get(TAG.hp_decision) not in VERDICT_VALUES or step is None:
        return None
    saturation = dict(run.scalars.get(TAG.saturation, [])).get(step)
    if saturation is None:
        return None
    threshold, window, trust = hp.get(TAG.hp_threshold), hp.get(TAG.hp_window), hp.get(TAG.hp_trust)
    return LiveReading(
        decision=hp[TAG.hp_decision],
        saturation=float(saturation),
        threshold=float(threshold) if isinstance(threshold, (int, float)) else float("nan"),
        step=int(step),
        window=int(window) if isinstance(window, (int, float)) and window > 0 else None,
        trust=trust if isinstance(trust, str) and trust else None,
        found=f"the TensorBoard events in `{printable(str(run.path))}`",
    )


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
        raise ReplayUsageError(
            f"--live {str(path)!r}: no such file or folder. Pass the live run's TensorBoard folder "
            "(e.g. satmon_logs/demo/version_0)."
        )
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
        raise ReplayUsageError(
            f"--live {str(path)!r}: no live satmon verdict there (no Satmon/verdict of a screening "
            "window in its TensorBoard events). Pass the folder a TensorBoardLogger wrote for the run "
            "SaturationMonitor screened, or leave --live out."
        )
    if len(readings) > 1:
        names = ", ".join(printable(str(run.path)) for run, _ in readings[:5])
        raise ReplayUsageError(
            f"--live {str(path)!r}: {len(readings)} live runs there ({names}{', ...' if len(readings) > 5 else ''}); "
            "pass the one these checkpoints come from."
        )
    return readings[0][1]


def _live_from_hf_runs(output_dir: Path) -> LiveReading | None:
    """The live verdict in a Hugging Face ``output_dir``'s TensorBoard runs (``runs/<date>_<host>``, where the
    Trainer's ``TensorBoardCallback`` writes and satmon's callback reports): the one live run there, ``None`` when
    there is none or several (which one these checkpoints are of cannot be told: ``--live`` names it)."""
    from satmon.io.tensorboard_reader import load_runs

    runs_dir = output_dir / "runs"
    if not runs_dir.is_dir() or not any(p.name.startswith("checkpoint-") for p in output_dir.iterdir()):
        return None
    runs, _ = load_runs(runs_dir)
    readings = [r for run in runs if (r := _reading_of(run)) is not None]
    return readings[0] if len(readings) == 1 else None


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
            reading = live_from_tensorboard(run, explicit=False) or _live_from_hf_runs(run)
        except OSError:
            reading = None
    if reading is not None:
        return ReplaySource(run=name, live=reading)
    return ReplaySource(
        run=name,
        missing="no satmon state with a verdict saved with the checkpoints and no satmon "
        "verdict in TensorBoard events beside them; pass --live RUN (the live run's "
        "TensorBoard folder) to compare",
    )
