"""What a replay writes, checked before any work, and the text it is summed up in.

:func:`check_outputs` checks every path a replay writes (the TensorBoard root and run name, ``json`` and its
file of partial records, ``report`` and its plots) and returns them as :class:`Outputs`;
:func:`write_report` writes the markdown report from the records; :func:`live_lines`,
:func:`nonfinite_lines` and :func:`unverified` are the lines the command line and the report share.
Messages name the command line's options (``--json``), which are the fields of
:class:`satmon.replaying.options.ReplayOptions` of the same name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from satmon.replaying.user_code import ReplayUsageError, printable

__all__ = [
    "Outputs",
    "check_folder",
    "check_outputs",
    "check_utf8",
    "live_lines",
    "nonfinite_lines",
    "run_writes",
    "unverified",
    "write_report",
]


@dataclass
class Outputs:
    """Every path the replay writes, checked before any work (symlinks resolved: a link's target is written).

    Attributes:
        logdir: the TensorBoard root (``None``: no TensorBoard run).
        name: the run name under it (``"replay"`` when ``source`` names the run).
        source: the run the checkpoints are of: the TensorBoard run is ``replay of SOURCE``.
        json, partial: the records' file and the file of records as they come.
        report, plots: the markdown report and its plots.
        existed: the outputs that were there before (replaced at the end, their permissions kept).
    """

    logdir: Path | None
    name: str
    source: str | None = None
    json: Path | None = None
    partial: Path | None = None
    report: Path | None = None
    plots: list[Path] = field(default_factory=list)
    existed: set[Path] = field(default_factory=set)


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def check_utf8(option: str, value: str) -> None:
    """TensorBoard, and the links of a markdown report, take only UTF-8 paths: an output name with bytes that are not
    UTF-8 is refused before any work, and so is one holding control characters (every line naming it would send them
    to the terminal).

    Example:
        >>> check_utf8("--name", "replay") is None
        True
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ReplayUsageError(
            f"Expected {option} to be a UTF-8 name (TensorBoard, JSON and markdown write only those), "
            f"got '{printable(value)}': pass another name."
        ) from None
    if not value.isprintable():
        raise ReplayUsageError(
            f"Expected {option} to be a name without control characters (every line naming it would "
            f"send them to the terminal), got '{printable(value)}': pass another name."
        )


def check_folder(option: str, value: str, beneath: Sequence[str | os.PathLike] = ()) -> Path:
    """A folder that can be created or written: refused when empty, a file (or a FIFO, a socket...: named by its kind),
    under a file or a read-only folder, or with no room beneath it for ``beneath`` (the paths satmon writes there).

    Example:
        >>> check_folder("--logdir", "")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        satmon.replaying.user_code.ReplayUsageError: Expected --logdir to name a folder, got an empty name:
        pass a path such as satmon_logs.
    """
    from satmon.io.atomic import OutputError, check_name_lengths, room
    from satmon.paths import kind_of, kind_phrase, not_a_folder

    if not value.strip():
        raise ReplayUsageError(
            f"Expected {option} to name a folder, got an empty name: pass a path such as satmon_logs."
        )
    check_utf8(option, value)
    path = Path(value)  # literally: no ~ or $VAR expansion (what is checked is what is written)
    try:
        check_name_lengths(path, option)
        room(option, path, beneath)
    except OutputError as e:
        raise ReplayUsageError(str(e)) from None
    if (said := not_a_folder(path)) is not None:  # a file, a FIFO, a device, a link to one, a symlink loop
        raise ReplayUsageError(
            f"Expected {option} {value!r} to be a folder, got {said}: pass a folder path (it is created if missing)."
        )
    existing = next((a for a in (path, *path.parents) if os.path.lexists(a)), Path("."))  # a broken link or loop too
    if kind_of(existing).kind != "folder":
        raise ReplayUsageError(
            f"Expected {option} {value!r} under a folder, got {kind_phrase(existing)} at "
            f"{str(existing)!r}: pass a path in a writable folder."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ReplayUsageError(
            f"{option} {value!r}: cannot write there: no write permission on {str(existing)!r}. "
            "Pass a path in a writable folder."
        )
    return path


def run_writes(root: Path, run_name: str, named: bool) -> list[str]:
    """The deepest paths a replay's TensorBoard run writes under ``root``, at their longest: ``replay of RUN (NNNN)/``
    or ``NAME/version_NNNN/`` (:func:`satmon.io.tensorboard_replay.claim_run_folder`), then TensorBoard's event file."""
    from satmon.io.tensorboard_replay import next_version
    from satmon.paths import event_file

    if named:
        run = root / f"{run_name} ({'9' * 4})"
    else:
        digits = max(len(str(next_version(root / run_name))), 4)
        run = root / run_name / f"version_{'9' * digits}"
    return [str(run), event_file(run)]


def _check_tensorboard(logdir: str | os.PathLike | None, name: str | None, source: str | None) -> Outputs:
    from satmon.io.atomic import OutputError

    if logdir is None:
        return Outputs(logdir=None, name=name or "replay", source=None)
    root = check_folder("--logdir", os.fspath(logdir))
    run_name = name if name is not None else f"replay of {source}" if source else "replay"
    check_utf8("--name", run_name)
    parts = Path(run_name).parts
    if not run_name.strip() or Path(run_name).is_absolute() or any(p in ("..", ".") for p in parts):
        raise ReplayUsageError(
            f"Expected --name to be a run name such as 'replay' (a relative path without '.' or '..'), "
            f"got {run_name!r}."
        )
    run = root / run_name
    named = name is None and bool(source)
    if os.path.lexists(run) and not os.path.isdir(run):  # a file, a socket, a FIFO, a broken link...: named by kind
        from satmon.paths import kind_phrase

        raise ReplayUsageError(
            f"Expected --logdir/--name {str(run)!r} to be a folder (the TensorBoard run folder goes "
            f"there), got {kind_phrase(run)}: pass another --name or --logdir."
        )
    from satmon.io.atomic import room

    try:  # room beneath for what the run writes (version_N, TensorBoard's event file), said of the longer part
        try:
            room(
                "--logdir/--name" if len(run_name) > len(os.fspath(logdir)) else "--logdir",
                root,
                run_writes(root, run_name, named),
                "--name (without one the run is named 'replay of RUN')",
            )
        except OutputError:
            from satmon.paths import length_problem

            for part in Path(run_name).parts:  # a name of the run's over NAME_MAX: said of that name
                if (problem := length_problem(part)) is not None:
                    raise OutputError(
                        f"Expected --name to be a run name whose names fit the file system, got {problem}: "
                        "pass a shorter --name."
                    ) from None
            raise
    except OutputError as e:
        raise ReplayUsageError(str(e)) from None
    check_folder("--logdir/--name", str(run))  # a folder or nothing there; writable where it exists
    real_logdir, real_run = os.path.realpath(root), os.path.realpath(run)
    if os.path.commonpath([real_logdir, real_run]) != real_logdir:  # checked where it resolves, as it is written
        raise ReplayUsageError(
            f"Expected --name {run_name!r} to stay under --logdir, got {str(run)!r}, which resolves to "
            f"{real_run!r} (a symlink out of it): pass another --name."
        )
    return Outputs(logdir=root, name="replay" if named else run_name, source=source if named else None)


def check_outputs(
    *,
    logdir: str | os.PathLike | None,
    name: str | None,
    source: str | None,
    json: str | os.PathLike | None,
    report: str | os.PathLike | None,
    data: str | os.PathLike | None,
) -> Outputs:
    """Check every output path before any work: the TensorBoard folder and run name (``replay of SOURCE`` when
    ``name`` is ``None`` and the source run has a name), ``json`` and its partial file, ``report`` and its plots;
    none may be the ``data`` file.

    Raises:
        ReplayUsageError: a path that cannot be written, or would replace what it must not (the message says which).
    """
    from satmon.io.atomic import OutputError, check_output
    from satmon.io.markdown import PLOTS, report_paths

    out = _check_tensorboard(logdir, name, source)
    given = {
        "--json": None if json is None else os.fspath(json),
        "--report": None if report is None else os.fspath(report),
    }

    def beside(path: Path, what: str, option: str, resolve: bool = True) -> Path:
        if path.is_dir():
            raise ReplayUsageError(
                f"{option} {given[option]!r}: {str(path)!r} is a folder, where {what} goes: move it "
                f"away or pass another {option}."
            )
        checked = check_output(path, f"{option}'s {what}")
        return _resolved(checked) if resolve else checked

    for option, value in given.items():
        if value is not None:
            check_utf8(option, value)
    try:
        if given["--json"] is not None:
            out.json = _resolved(check_output(given["--json"], "--json", (".json", ".jsonl")))
            # satmon's own file: its name is replaced, never resolved (a symlink there points at a file of the user's)
            out.partial = beside(
                out.json.with_name(out.json.name + ".partial.jsonl"),
                "the file of partial records",
                "--json",
                resolve=False,
            )
        if given["--report"] is not None:
            out.report = _resolved(check_output(given["--report"], "--report", (".md",)))
            out.plots = [beside(p, f"its {n} plot", "--report") for p, n in zip(report_paths(out.report)[1:], PLOTS)]
    except OutputError as e:
        raise ReplayUsageError(str(e)) from None
    for target in (out.json, out.report, *out.plots):
        if target is not None and target.exists():
            out.existed.add(target)
    real_data = os.path.realpath(data) if data is not None else None
    for option, target in (
        ("--json", out.json),
        ("--json", out.partial),
        ("--report", out.report),
        *(("--report", plot) for plot in out.plots),
    ):
        if target is not None and real_data is not None and os.path.realpath(target) == real_data:
            raise ReplayUsageError(
                f"Expected {option} to write another file than --data {os.fspath(data)!r}, got the same "
                "file: it would be replaced by the replay's outputs. Pass another name."
            )
    if out.report is not None:
        from satmon.io.markdown import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as e:
            raise ReplayUsageError(f"--report: {e}") from e
    return out


# ------------------------------------------------------------------------------------------ text
def _source_of(records: Sequence[Any]) -> Any:
    """The source run the records name (:class:`~satmon.results.live_replay.ReplaySource`), or ``None``."""
    return next((s for s in (getattr(r, "source", None) for r in records) if s is not None), None)


def _nearest(records: Sequence[Any], step: int) -> Any:
    """The replayed record whose step is nearest ``step`` (the later one on a tie)."""
    scored = [r for r in records if r.verdict is not None]
    return min(scored, key=lambda r: (abs((r.global_step or 0) - step), -(r.global_step or 0))) if scored else None


def _compared(records: Sequence[Any]) -> list[Any]:
    """The records shown beside the live verdict: the one nearest its step, and the last."""
    source = _source_of(records)
    if source is None or source.live is None:
        return []
    near = _nearest(records, source.live.step)
    last = next((r for r in reversed(records) if r.verdict is not None), None)
    return [r for r in dict.fromkeys((near, last)) if r is not None]


def live_lines(records: Sequence[Any], markdown: bool = False) -> list[str]:
    """The run these records' checkpoints come from, its live verdict beside the replay's (the checkpoint nearest the
    verdict's step, and the last), and why they can differ; ``[]`` when the records name no source run."""
    from satmon.io.markdown import table
    from satmon.results.live_replay import WHY, agreement, comparison_rows

    source = _source_of(records)
    if source is None:
        return []
    head = source.headline()
    lines = [head if markdown else head.replace("`", "")]
    shown = _compared(records)
    if source.live is None or not shown:
        return lines
    rows = comparison_rows(source.live, [(r.verdict, Path(r.checkpoint).name, r.global_step) for r in shown])
    lines += ["", table(["reading", "decision", "pooled saturation", "what was read"], rows), ""]
    lines.append(f"{agreement(source.live, [r.verdict for r in shown])} Why they can differ: {WHY}")
    return lines


def nonfinite_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line naming the replayed checkpoints that held NaN/inf (``[]``: none did).

    Example:
        >>> nonfinite_lines([{"step": 4, "name": "a.ckpt", "nonfinite": "3 weights"}])[0][:52]
        'Non-finite values (NaN/inf) in 1 replayed checkpoint'
    """
    bad = [r for r in rows if r["nonfinite"]]
    if not bad:
        return []
    return [
        f"Non-finite values (NaN/inf) in {len(bad)} replayed checkpoint(s): "
        + "; ".join(f"step {r['step']} {r['name']}: {r['nonfinite']}" for r in bad)
        + ". The run diverged there: the saturation rule does not apply (exit code 3)."
    ]


def unverified(ordered: Sequence[Any]) -> str:
    """What could not be checked for damage: checkpoints in formats that record no checksum (``""``: none)."""
    names = [i.path.name for i in ordered if any(not w.checksummed for w in i.weights)]  # DCP: zip chunks
    if not names:
        return ""
    shown = ", ".join(printable(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"{len(names)} checkpoint(s) record no checksum ({shown}: .safetensors, or torch files older than its zip "
        "format): damaged bytes in them cannot be detected, only a damaged structure."
    )


def write_report(
    out: Outputs,
    records: Sequence[Any],
    dicts: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    *,
    settings: Any,
    code: str,
    device: str,
    dtype: str,
    data_text: str,
    log_dir: Path | None,
    notes: Sequence[str],
) -> list[Path]:
    """The markdown report (and its plots) at ``out.report``, each replaced only by a complete file; the paths written.

    The threshold and the level are the replay's :class:`satmon.Settings`' (the rule every checkpoint was read with).
    """
    from satmon.io.markdown import write_report as write_markdown
    from satmon.results.card import cut_off

    ok = [r for r in rows if r["error"] is None]
    last = next((r for r in reversed(records) if r.verdict is not None), None)
    # erf/hardtanh: their own
    counted = cut_off(last.verdict) if last is not None else f"|alpha x| > {settings.level:g}"
    intro = [
        f"Model `{code}`; {len(ok)} of {len(rows)} checkpoint(s) replayed on {device} "
        f"({dtype} forward, float64 statistics); calibration: {data_text}.",
        f"GO threshold {settings.rule.threshold:g} on pooled saturation ({counted}); TensorBoard run `{log_dir}`.",
    ] + [f"\n**{line}**" for line in notes]
    live = live_lines(records, markdown=True)
    if live:
        intro += ["", *live]
    assert out.report is not None
    return write_markdown(
        out.report,
        list(dicts),
        list(rows),
        threshold=settings.rule.threshold,
        intro=intro,
        last_card=None if last is None else last.card(),
    )
