"""``satmon.replay(paths, ...)``: the replay of saved checkpoints as a library call that yields records.

:class:`ReplaySession` owns the whole replay but the printing: every argument and output checked before any work,
the outputs' locks (one writer per output), the listing of the checkpoints, their inspection and order, the
run they come from (computed once, from the listing) and its live verdict, the calibration batches, the model
check on the meta device, the loop (:func:`satmon.replaying.loop.checkpoint_records`) and the outputs: a TensorBoard
run, the records as they come (``FILE.partial.jsonl``), ``json`` once complete, the markdown ``report``. ``satmon
replay`` (:mod:`satmon.cli.replay`) parses its flags into one :class:`~satmon.replaying.options.ReplayOptions` and
prints what this yields. The walk of one checkpoint path: this module -> :mod:`satmon.replaying.checkpoints` (list,
inspect, order) -> :mod:`satmon.replaying.live` (the source run) -> :mod:`satmon.replaying.loop` (build, probe).

Nothing from a file runs unless asked: checkpoints are read with ``torch.load(weights_only=True)`` unless
``trust_checkpoints=True``; ``model``/``factory``/``datamodule`` given as ``"MODULE:ATTR"`` strings import and
run that code (objects are used as they are).
"""

from __future__ import annotations

import atexit
import os
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from satmon.replaying.options import ReplayOptions, options_of
from satmon.replaying.outputs import Outputs, check_outputs, nonfinite_lines, unverified, write_report
from satmon.replaying.user_code import ReplayUsageError, printable, short
from satmon.settings import settings_from

__all__ = ["CALIBRATION_FILE", "ReplayOptions", "ReplaySession", "replay"]

#: The calibration batches the live probe saves beside a run's logs: a replay of that run's folder reads them when no
#: other data is given (the name is :mod:`satmon.replaying.checkpoints`', whose listing
#: never counts it as a checkpoint).
from satmon.paths import CALIBRATION_FILE  # noqa: E402

#: Replays being iterated: closed at exit (before the interpreter stops TensorBoard's writer thread, which a replay
#: left suspended and closed by the garbage collector at shutdown would wait for forever).
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _close_open_replays() -> None:
    for replay in list(_OPEN):
        replay.close()


_DTYPES = ("float32", "bfloat16")
_DEVICES = ("auto", "cpu", "cuda")


def _named(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None)
    return f"{type(obj).__name__} {name}" if isinstance(name, str) else short(obj, 80)


def _code_name(obj: Any) -> str:
    """How the report names the model code: the string given, or ``module:qualname``."""
    if obj is None or isinstance(obj, str):
        return str(obj)
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def found_calibration(paths: Sequence[str | os.PathLike], run: Path | None) -> Path | None:
    """The live run's calibration batches (:data:`CALIBRATION_FILE`) in a replayed folder or in the run folder the
    checkpoints come from, a regular file; ``None`` when there is none.

    Raises:
        ReplayUsageError: a :data:`CALIBRATION_FILE` is there but is not a regular file (a FIFO, a socket, a device,
            a folder, a broken link): named with its kind, never opened.

    Example:
        >>> import tempfile
        >>> found_calibration([tempfile.mkdtemp()], None) is None
        True
    """
    from satmon.paths import kind_of

    folders = [Path(p) for p in paths if Path(p).is_dir()] + ([run] if run is not None else [])
    odd = None
    for folder in dict.fromkeys(folders):
        candidate = folder / CALIBRATION_FILE
        kind = kind_of(candidate)  # lstat/stat only: a FIFO, a device or a folder is never opened
        if kind.regular:
            return candidate
        if kind.kind != "missing" and odd is None:
            odd = (candidate, kind)
    if odd is not None:
        candidate, kind = odd
        raise ReplayUsageError(
            f"No calibration data: {printable(str(candidate)[:240])!r} has the name of satmon's "
            f"calibration batches but is {kind.describe()}, not a regular file (it was not opened). "
            "Pass --data FILE or --datamodule MODULE:CLASS, or replace it with the live run's "
            "batches."
        )
    return None


class ReplaySession:
    """A replay of saved checkpoints: checked and prepared when made, replayed as it is iterated (one
    :class:`~satmon.results.replay_record.ReplayRecord` per checkpoint, in step order, then one per checkpoint
    that could not be read).

    Made by :func:`satmon.replay` (:func:`replay`) from the paths and one
    :class:`~satmon.replaying.options.ReplayOptions`. When the iteration
    ends the outputs are complete: ``json`` written (atomically), the partial file removed, the report written,
    the locks released. Stopping early (``close()``, leaving a ``with`` block, an exception) leaves ``json`` and
    ``report`` as they were and the records so far in :attr:`partial`.

    Attributes:
        options: what the replay was told (:class:`~satmon.replaying.options.ReplayOptions`).
        settings: the rule every checkpoint is read with.
        outputs: every path written (:class:`~satmon.replaying.outputs.Outputs`).
        listing: what :func:`~satmon.replaying.checkpoints.list_checkpoints` found.
        infos: every inspected checkpoint; ``ordered``: the readable ones, in step order.
        source: the run the checkpoints come from and its live verdict
            (:class:`~satmon.results.live_replay.ReplaySource`).
        data_text: where the calibration batches came from, in words.
        device: where the model runs.
        records, dicts, rows: what was replayed so far (the records, their JSON dicts, their summary rows).
        tensorboard: the TensorBoard run (``log_dir`` ``None`` until the first record).
        partial: the file of records as they come (``None`` without ``json``).
        json_written, report_written: the final files, once written.
    """

    def __init__(
        self, paths: str | os.PathLike | Sequence[str | os.PathLike], options: ReplayOptions | None = None
    ) -> None:
        self.options = options = options_of(options, {})
        on_status, on_note = options.on_status, options.on_note
        self._status = on_status or (lambda text: None)
        self._note = on_note or (lambda text: None)
        self.records: list[Any] = []
        self.dicts: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.total = self.done = 0
        self.started = False
        self.partial: Any = None
        self.tensorboard: Any = None
        self.json_written: Path | None = None
        self.report_written: list[Path] = []
        self._locks = ExitStack()
        self._gen: Iterator[Any] | None = None
        try:
            self._prepare(paths, options)
        except BaseException:
            self._locks.close()
            raise

    # ------------------------------------------------------------------------------------ preparing
    def _prepare(self, paths: str | os.PathLike | Sequence[str | os.PathLike], options: ReplayOptions) -> None:
        from satmon.replaying import checkpoints as ck
        from satmon.replaying.listing import list_checkpoints, nothing_to_replay
        from satmon.replaying.live import find_source, run_name, source_run

        o = options
        model, factory, data, datamodule, batches, batch_size = (
            o.model,
            o.factory,
            o.data,
            o.datamodule,
            o.batches,
            o.batch_size,
        )
        device, dtype, live = o.device, o.dtype, o.live
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise ReplayUsageError("Expected at least one checkpoint file or folder, got none.")
        self.settings = settings_from(o.settings, {}, owner="replay")
        for option, value in (("--batches", batches), ("--batch-size", batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ReplayUsageError(f"Expected {option} >= 1, got {value!r}.")
        if dtype not in _DTYPES:
            raise ReplayUsageError(f"Expected --dtype in {_DTYPES}, got {dtype!r}.")
        self.n_batches, self.batch_size, self.input_key, self.trust, self.twin, self.dtype = (
            batches,
            batch_size,
            o.input_key,
            bool(o.trust_checkpoints),
            bool(o.twin),
            dtype,
        )
        data_path = data if isinstance(data, (str, os.PathLike)) else None
        # the run the checkpoints come from: computed once, from the paths given (the listing, below, is of the same)
        self.run_folder = source_run([Path(p) for p in self.paths])
        self.outputs = out = check_outputs(
            logdir=o.logdir,
            name=o.name,
            source=run_name(self.run_folder) if o.name is None else None,
            json=o.json,
            report=o.report,
            data=data_path,
        )
        found = None
        if data is None and datamodule is None:
            data_path = data = found = found_calibration(self.paths, self.run_folder)
            if data is None:
                raise ReplayUsageError(
                    "No calibration data: pass --data FILE (a torch.save'd tensor, list of batches or "
                    "dict of tensors) or --datamodule MODULE:CLASS (e.g. "
                    "satmon.demos.corpus:CorpusDataModule)."
                )
        if data is not None and datamodule is not None:
            raise ReplayUsageError("Expected either --data or --datamodule, got both: drop one.")
        if model is None and factory is None:
            raise ReplayUsageError(
                "Pass --model MODULE:CLASS (a LightningModule, for .ckpt files) or --factory "
                "MODULE:FUNCTION (returns the nn.Module, for plain state_dict files)."
            )
        from satmon.paths import kind_of

        if live is not None and kind_of(live).kind not in ("folder", "file"):  # a FIFO, a name too long...
            raise ReplayUsageError(
                f"--live {os.fspath(live)[:240]!r}: {kind_of(live).describe()}. Pass the live run's "
                "TensorBoard folder (e.g. satmon_logs/demo/version_0), or leave --live out."
            )
        if data_path is not None:  # by its kind, never opened (satmon.paths)
            from satmon.replaying.data import check_data_file

            check_data_file(data_path)
        import torch

        if device not in _DEVICES and not isinstance(device, torch.device):
            raise ReplayUsageError(f"Expected --device in {_DEVICES}, got {device!r}.")
        if str(device) == "cuda" and not torch.cuda.is_available():
            raise ReplayUsageError("--device cuda: no CUDA device is available here; pass --device cpu (or auto).")
        self.device = torch.device(
            "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
        )
        self.code = _code_name(model if model is not None else factory)
        model_cls, factory_fn, dm_cls = _user_objects(model, factory, datamodule)

        from satmon.replaying.data import input_forward_fn, load_data_file
        from satmon.replaying.loop import ModelLoader

        if found is not None:  # every argument checked: the note is not followed by a usage error of another argument
            self._note(
                f"calibration batches: {printable(str(found))} (the live run's {CALIBRATION_FILE}, saved by its "
                "live probe); pass --data or --datamodule to use others."
            )
        self.listing = listing = list_checkpoints(self.paths, exclude=[p for p in (data_path, out.partial) if p])
        if not listing.paths:
            raise ReplayUsageError(nothing_to_replay(self.paths, listing))
        self.unread = listing.unread()
        for path, why in listing.explicit + self.unread + listing.broken_links():
            self._note(f"not replayed: {printable(str(path))}: {why}.")
        given = (
            load_data_file(data_path, batches, batch_size)
            if data_path is not None
            else _batches_of(data, batches, batch_size)
            if data is not None
            else None
        )
        if data is not None and not given:
            raise ReplayUsageError("Expected --data to hold at least one calibration batch, got none.")
        if self.trust:
            self._note(
                "--trust-checkpoints: checkpoints are read with torch.load(weights_only=False), which runs code "
                "stored in them."
            )
        self._status(
            f"found {len(listing.paths)} checkpoint(s); reading their index ("
            + (
                "torch.load(weights_only=False): --trust-checkpoints"
                if self.trust
                else "weights only: no code in them runs"
            )
            + ")"
        )
        self.infos = [ck.inspect_checkpoint(p, trust=self.trust, stamps=listing.stamps[p]) for p in listing.paths]
        self.ordered = ck.order_checkpoints(self.infos)
        self.loader = ModelLoader(model_cls, factory_fn, device=self.device)
        first = self._check_model(model, factory)
        if given and first is not None:
            self._check_token_ids(given, first, found, data_path)
        self.source = find_source(self.run_folder, self.ordered, live=live)
        self._status(source_line(self.source))
        self.data_text, self.probe_kwargs, self.batches = "none (no readable checkpoint)", {}, given or []
        if self.ordered:
            self._status("building the calibration batches" + (f" from {datamodule}" if dm_cls is not None else ""))
            if given is not None:
                self.data_text = f"{len(given)} batch(es) from {data_path if data_path is not None else 'data='}"
            else:
                self.batches, self.data_text = _datamodule_batches(dm_cls, self.ordered, batches)
            self.probe_kwargs = dict(
                forward_fn=input_forward_fn(self.batches, o.input_key),
                device=self.device,
                autocast_dtype=torch.bfloat16 if dtype == "bfloat16" else None,
            )
        self.todo = self.ordered + [i for i in self.infos if i.error is not None]
        self._lock(out)  # every argument checked: the outputs are this replay's from here on

    def _lock(self, out: Outputs) -> None:
        """One writer per output: ``json`` (and so its partial file) and ``report`` are this process's until the replay
        ends; another live process holding one is refused here, named; a killed one's stale lock is taken over."""
        from satmon.io.atomic import OutputError
        from satmon.io.lock import exclusive

        for option, path in (("--json", out.json), ("--report", out.report)):
            if path is None:
                continue
            try:
                path.parent.mkdir(parents=True, exist_ok=True)  # checked writable above
                held = self._locks.enter_context(exclusive(path, option, folder=False))
            except OutputError as e:
                raise ReplayUsageError(str(e)) from None
            if held.note():
                self._note(f"{option}: {held.note()}: its partial records, if any, are an interrupted replay's.")

    def _check_model(self, model: Any, factory: Any) -> Any:
        """The model on the first buildable checkpoint, built on the meta device: a wrong model/factory stops here
        (unless a later checkpoint fits, which then replays while the others are skipped). Returns the first
        checkpoint the model fits (``None``: none can be built on the meta device)."""
        loader, ordered = self.loader, self.ordered
        checks = [loader.check(i) for i in ordered]
        if ordered and all(checks):
            raise ReplayUsageError(f"Cannot build any checkpoint: {checks[0]}.")
        buildable = [i for i, c in zip(ordered, checks) if c is None]
        if not buildable:
            return None
        problem = loader.mismatch(buildable[0])
        if problem is None:
            return buildable[0]
        fits = next((i for i in buildable[1:] if loader.mismatch(i) is None), None)
        if fits is None:
            option = (
                f"--model {_shown(model)}"
                if model is not None and buildable[0].kind == "lightning"
                else f"--factory {_shown(factory)}"
            )
            more = f" (nor any of the other {len(buildable) - 1})" if len(buildable) > 1 else ""
            raise ReplayUsageError(
                f"{option} does not build the checkpoints' model: {buildable[0].path.name}{more}: {problem}"
            )
        return fits

    def _check_token_ids(self, batches: Sequence[Any], info: Any, found: Path | None, data_path: Any) -> None:
        """The calibration batches against the model, before the first checkpoint: token ids past the model's
        vocabulary are another model's (or tokenizer's) batches, named here rather than blamed on every checkpoint."""
        from satmon.replaying.data import fed_token_ids

        vocabulary = self.loader.vocabulary(info)
        top = fed_token_ids(batches, self.input_key) if vocabulary is not None else None
        if top is None or vocabulary is None or top < vocabulary[0]:
            return
        size, layer = vocabulary
        past = (
            f"feed token ids up to {top:,}, past the model's vocabulary of {size:,} (nn.Embedding "
            f"{printable(layer) or '(the model itself)'}, as built for {printable(info.path.name)})"
        )
        if found is not None:
            raise ReplayUsageError(
                f"{printable(str(found))} (satmon's calibration batches, found beside the checkpoints "
                f"and used as --data) holds batches that {past}: they are another model's. Pass --data "
                "FILE (batches for this model) or --datamodule MODULE:CLASS, or move that file away."
            )
        given = f"--data {printable(str(data_path))}" if data_path is not None else "data="
        raise ReplayUsageError(
            f"{given}: its batches {past}: they are another model's or another tokenizer's. Pass "
            "calibration batches for this model."
        )

    # ------------------------------------------------------------------------------------ replaying
    def __iter__(self) -> Iterator[Any]:
        if self._gen is not None:
            raise RuntimeError(
                "Expected a Replay to be iterated once, got a second iteration: make a new satmon.replay(...)."
            )
        self._gen = self._run()
        _OPEN.add(self)
        return self._gen

    def _run(self) -> Iterator[Any]:
        from satmon.io.json_records import to_json
        from satmon.io.jsonl import PartialRecords
        from satmon.io.tensorboard_replay import LazyTensorBoardReplay
        from satmon.replaying.loop import checkpoint_records, summary_row

        out = self.outputs
        self.tensorboard = LazyTensorBoardReplay(
            out.logdir or ".", out.name, enabled=bool(self.ordered) and out.logdir is not None, source=out.source
        )
        finished = False
        try:
            if out.partial is not None:
                self.partial = PartialRecords(out.partial, out.json)
                if self.partial.replaced:
                    self._note(
                        f"{out.partial} (the records of an earlier interrupted replay) is replaced by this run's."
                    )
            self.total, self.started = len(self.todo), True
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", ".*LeafSpec.*")
                    for record in checkpoint_records(
                        self.todo,
                        self.loader,
                        self.batches,
                        settings=self.settings,
                        probe_kwargs=self.probe_kwargs,
                        twin=self.twin,
                        on_record=self.tensorboard,
                        source=self.source,
                    ):
                        self.records.append(record)
                        self.dicts.append(to_json(record.to_dict()))  # NaN/inf -> None, as written to json
                        if self.partial is not None:
                            self.partial.add(self.dicts[-1])
                        self.done += 1
                        self.rows.append(summary_row(self.dicts[-1]))
                        yield record
            finally:
                self.seconds = time.perf_counter() - t0
                self.tensorboard.close()
                if self.partial is not None:
                    self.partial.close()
            self._finish()
            finished = True
        finally:
            _OPEN.discard(self)
            if not finished:
                self._locks.close()

    def _finish(self) -> None:
        """The final outputs: ``json`` in one rename, the partial file removed, the report; then the locks go."""
        out = self.outputs
        try:
            if out.json is not None:
                from satmon.io.json_records import write_records

                write_records(out.json, self.dicts)  # complete: replaces the previous file in one rename
                self.json_written = out.json
                self.partial.remove()
            self.unverified = unverified(self.ordered)
            if out.report is not None:
                notes = nonfinite_lines(self.rows) + ([self.unverified] if self.unverified else [])
                self.report_written = write_report(
                    out,
                    self.records,
                    self.dicts,
                    self.rows,
                    settings=self.settings,
                    code=self.code,
                    device=self.device.type,
                    dtype=self.dtype,
                    data_text=self.data_text,
                    log_dir=self.log_dir,
                    notes=notes,
                )
        finally:
            self._locks.close()

    # ------------------------------------------------------------------------------------ what it found
    @property
    def nonfinite(self) -> bool:
        """A replayed checkpoint held NaN/inf (weights or DyT inputs): the run diverged there."""
        return any(r.nonfinite for r in self.records)

    @property
    def complete(self) -> bool:
        """Every checkpoint was replayed and every file or folder that may hold one could be read."""
        return not any(r["error"] for r in self.rows) and not self.unread

    def problems(self) -> list[str]:
        """What undercuts the replay, one line each: the checkpoints skipped (and those torch refused), the
        non-finite ones, and last, when it is, ``incomplete: ...`` (``[]``: none)."""
        lines, rows = [], self.rows
        skipped = [r["name"] for r in rows if r["error"]]
        if skipped:
            lines.append(f"{len(skipped)} checkpoint(s) skipped: " + ", ".join(skipped))
            refused = [printable(i.path.name) for i in self.infos if i.refused and not i.unsafe]
            if refused:
                lines.append(
                    f"{len(refused)} of them refused by torch.load(weights_only=True) for a type torch does not "
                    f"allow by default: {', '.join(refused)}; --trust-checkpoints would load them, and run code "
                    "stored in them: only for files you made or trust."
                )
        lines += nonfinite_lines(rows)
        if not self.complete:
            said = [f"{len(rows) - len(skipped)} of {len(rows)} checkpoint(s) replayed"]
            if skipped:
                said.append(f"{len(skipped)} skipped")
            if self.unread:
                shown = "; ".join(f"{printable(str(p))} ({why})" for p, why in self.unread[:3]) + (
                    "; ..." if len(self.unread) > 3 else ""
                )
                said.append(
                    f"{len(self.unread)} file(s) or folder(s) that may hold checkpoints could not be read: {shown}"
                )
            lines.append("incomplete: " + "; ".join(said) + ".")
        return lines

    def stopped(self, how: str) -> str:
        """One line for a replay stopped by ``how`` (``"interrupted (Ctrl-C)"``...): how far it got and where every
        output stands."""
        if not self.started:
            return f"satmon replay: {how} before the first checkpoint was replayed; nothing was written."
        said = [f"satmon replay: {how} after {self.done} of {self.total} checkpoint(s)"]
        out = self.outputs
        if out.json is not None and self.json_written is None:
            kept = "was left as it was" if out.json in out.existed else "was not written"
            where = (
                f"the {self.partial.count} new record(s) are in {self.partial.path}"
                if self.partial is not None and self.partial.count
                else "no record was complete"
            )
            said.append(f"{out.json} {kept}; {where}")
        if self.log_dir is not None:
            said.append(f"TensorBoard run {self.log_dir} holds the checkpoints replayed so far")
        if out.report is not None:
            said.append(
                f"no report was written ({out.report} {'left as it was' if out.report in out.existed else 'not made'})"
            )
        return ": ".join(said[:1]) + (": " + "; ".join(said[1:]) if len(said) > 1 else "") + "."

    @property
    def log_dir(self) -> Path | None:
        """The TensorBoard run folder (``None`` until the first record, and without ``logdir``)."""
        return None if self.tensorboard is None else self.tensorboard.log_dir

    def close(self) -> None:
        """Stop: the replay's files are closed (the records so far stay in :attr:`partial`) and the locks released;
        ``json`` and ``report`` stay as they were unless the replay had finished."""
        _OPEN.discard(self)
        if self._gen is not None:
            self._gen.close()  # type: ignore[attr-defined]
        self._locks.close()

    def __enter__(self) -> ReplaySession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _shown(obj: Any) -> str:
    return obj if isinstance(obj, str) else _code_name(obj)


def _user_objects(model: Any, factory: Any, datamodule: Any) -> tuple[Any, Any, Any]:
    """``(model_cls, factory, datamodule_cls)``: imported when named as ``"MODULE:ATTR"`` strings (which runs that
    code), each checked (a LightningModule is recognised by its bases: Lightning is not imported here)."""
    from satmon.replaying.loop import is_lightning_module
    from satmon.replaying.user_code import import_object

    model_cls = import_object(model, "--model", "satmon.demos.lit:LitLM") if isinstance(model, str) else model
    if model_cls is not None and not is_lightning_module(model_cls):
        raise ReplayUsageError(
            f"--model {_shown(model)}: expected a LightningModule class, got {_named(model_cls)}. For a "
            "plain nn.Module pass --factory MODULE:FUNCTION returning it."
        )
    fn = import_object(factory, "--factory", "mypkg.model:build") if isinstance(factory, str) else factory
    if fn is not None and not callable(fn):
        raise ReplayUsageError(
            f"--factory {_shown(factory)}: expected a callable returning an nn.Module, got {_named(fn)}."
        )
    dm_cls = (
        import_object(datamodule, "--datamodule", "satmon.demos.corpus:CorpusDataModule")
        if isinstance(datamodule, str)
        else datamodule
    )
    if dm_cls is not None and not (isinstance(dm_cls, type) and hasattr(dm_cls, "train_dataloader")):
        raise ReplayUsageError(
            f"--datamodule {_shown(datamodule)}: expected a LightningDataModule class with "
            f"train_dataloader(), got {_named(dm_cls)}."
        )
    return model_cls, fn, dm_cls


def _batches_of(data: Any, n: int, batch_size: int | None) -> list[Any]:
    """Batches given as objects (``data=`` from Python), by :func:`satmon.replaying.data.load_data_file`'s rule: a
    tensor or a dict of tensors is one batch (or ``batch_size`` rows each), a list or tuple one batch per item."""
    from collections.abc import Mapping

    from torch import Tensor

    from satmon.batches import split_batch

    if (
        isinstance(data, Tensor)
        or isinstance(data, Mapping)
        and data
        and all(isinstance(v, Tensor) for v in data.values())
    ):
        return split_batch(data, batch_size)[:n]
    if isinstance(data, (list, tuple)):
        return list(data)[:n]
    raise ReplayUsageError(
        f"Expected data to be a file, a tensor, a dict of tensors or a list of batches, got {type(data).__name__}."
    )


def _datamodule_batches(dm_cls: type, ordered: Sequence[Any], n: int) -> tuple[list[Any], str]:
    """The datamodule's batches, built with the checkpoint's datamodule hyper-parameters, and where they came from."""
    from satmon.replaying.data import datamodule_batches

    hp = next((i.datamodule_hparams for i in ordered if i.datamodule_hparams), {})
    batches = datamodule_batches(dm_cls, hp, n)
    return batches, f"{len(batches)} batch(es) of {dm_cls.__name__}.train_dataloader()" + (
        f" with the checkpoint's hyper-parameters {short(hp)}" if hp else " with its default arguments"
    )


def source_line(source: Any) -> str:
    """The status line naming the source run and what its live window said."""
    live = source.live
    if live is None:
        return f"replay of {source.run}: its live verdict was not found ({source.missing})"
    from satmon.results.live_replay import decision_text

    return (
        f"replay of {source.run}: its live window said {decision_text(live.decision, live.trust)} at step {live.step} "
        f"(pooled saturation {live.saturation:.4f}; read from {live.found.replace('`', '')})"
    )


def replay(
    paths: str | os.PathLike | Sequence[str | os.PathLike], options: ReplayOptions | None = None, **changes: Any
) -> ReplaySession:
    """Replay every satmon diagnostic over saved checkpoints; iterate the result for one record per checkpoint.

    ``satmon.replay(...)`` is this function. Everything is checked when it is called (the arguments, every output
    path, the user's code, the checkpoints' listing and index, the model on the first checkpoint built on the meta
    device), before any checkpoint is replayed: a problem raises
    :class:`~satmon.replaying.user_code.ReplayUsageError` and writes nothing. The records come as the checkpoints are
    replayed; a checkpoint that cannot be read, built or probed is a record with ``error`` set.

    Args:
        paths: checkpoint files, or folders searched recursively (``.ckpt``/``.pt``/``.pth``/``.safetensors`` files,
            Hugging Face ``checkpoint-N`` folders and torch.distributed.checkpoint folders).
        options: the replay's options, whole (:class:`~satmon.replaying.options.ReplayOptions`: the model code,
            the calibration data, the rule, the device, the outputs; default: every option's default).
        **changes: options by name, applied over ``options`` (``factory=build, data=batches``).

    Returns:
        A :class:`ReplaySession`: iterate it for the records; its attributes hold the source run, the outputs
        written...

    Raises:
        ReplayUsageError: any option or output that cannot work (an unknown option name included), before any
            checkpoint is replayed; another process
            writing the same ``json`` or ``report`` (its pid named).

    Example:
        >>> import os, tempfile, torch, satmon
        >>> net = lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        >>> folder = tempfile.mkdtemp()
        >>> torch.save({"model": net().state_dict(), "iter_num": 5}, os.path.join(folder, "w.pt"))
        >>> records = list(satmon.replay(folder, factory=net, data=[torch.randn(8, 4)], twin=False, device="cpu"))
        >>> [(r.global_step, r.error, r.report.layers["1"].kind) for r in records]
        [(5, None, 'layernorm')]
    """
    return ReplaySession(paths, options_of(options, changes))
