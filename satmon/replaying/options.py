"""The replay's options, held once: :class:`ReplayOptions`, passed whole from the command line or the caller to
:func:`satmon.replay` and on to :class:`~satmon.replaying.session.ReplaySession`.

Every option is checked by the session when the replay is made (before any work), in the order its errors are
most useful; this object only holds them. Variants are made with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from satmon.replaying.user_code import ReplayUsageError
from satmon.settings import Settings

__all__ = ["ReplayOptions", "options_of"]


def note_to_stderr(text: str) -> None:
    """The default ``on_note``: ``satmon replay: note: TEXT`` on stderr."""
    print(f"satmon replay: note: {text}", file=sys.stderr)


@dataclass(frozen=True)
class ReplayOptions:
    """Everything a replay is told but the checkpoints' paths: the model code, the calibration data, the rule, how
    the checkpoints are read and run, and the outputs.

    Attributes:
        model: a ``LightningModule`` class (``.ckpt`` files are rebuilt from their hyper-parameters), or
            ``"MODULE:CLASS"`` (imported: runs that code).
        factory: a function returning the ``nn.Module`` (plain state-dict files, Hugging Face folders), or
            ``"MODULE:FUNCTION"``.
        data: calibration batches: a ``torch.save``'d file (read with ``weights_only=True``), or the batches
            themselves (a tensor or a dict of tensors: one batch, or ``batch_size`` rows each; a list: one batch an
            item). ``None`` with no ``datamodule``: the live run's ``satmon_calibration.pt`` in a replayed folder
            or the run folder, when there is one (said through ``on_note``).
        datamodule: a ``LightningDataModule`` class (its ``train_dataloader``, built with the datamodule
            hyper-parameters stored in the checkpoint), or ``"MODULE:CLASS"``.
        settings: the rule every checkpoint is read with (default: the study's).
        batches: how many calibration batches.
        batch_size: split a tensor into batches of this many rows.
        input_key: feed only ``batch[input_key]``.
        trust_checkpoints: read checkpoints with ``torch.load(weights_only=False)``, which runs code stored in them.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        dtype: ``"float32"`` or ``"bfloat16"`` (autocast) forwards.
        twin: also probe a random-init twin (the init-to-trained readout of LayerNorm/RMSNorm models).
        live: the live run's TensorBoard folder (default: found in the checkpoints' satmon state, or beside them).
        logdir: write a TensorBoard run to ``logdir/NAME/version_N``; ``None``: no TensorBoard run.
        name: the run's ``NAME`` (default: ``replay of RUN``).
        json: write the records there (``.json``: an array, ``.jsonl``: one a line) when the replay is complete;
            ``FILE.partial.jsonl`` holds them as they come.
        report: a markdown report with PNG plots beside it (needs matplotlib).
        on_status: called with each status line (default: none).
        on_note: called with each note (a file not replayed, the calibration file used...; default: to stderr).

    Example:
        >>> options = ReplayOptions(factory="mypkg.model:build", batches=8)
        >>> options.batches, options.twin, dataclasses.replace(options, twin=False).twin
        (8, True, False)
    """

    model: type | str | None = None
    factory: Callable[[], Any] | str | None = None
    data: str | os.PathLike | Sequence[Any] | Any | None = None
    datamodule: type | str | None = None
    settings: Settings | None = None
    batches: int = 4
    batch_size: int | None = None
    input_key: str | None = None
    trust_checkpoints: bool = False
    device: Any = "auto"
    dtype: str = "float32"
    twin: bool = True
    live: str | os.PathLike | None = None
    logdir: str | os.PathLike | None = None
    name: str | None = None
    json: str | os.PathLike | None = None
    report: str | os.PathLike | None = None
    on_status: Callable[[str], None] | None = None
    on_note: Callable[[str], None] | None = note_to_stderr

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options' names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))


def options_of(options: ReplayOptions | None, changes: Mapping[str, Any]) -> ReplayOptions:
    """``options`` (default: every option's default) with ``changes`` applied; an unknown name is refused, named.

    Example:
        >>> options_of(None, {"batches": 2}).batches
        2
        >>> options_of(None, {"batchs": 2})
        Traceback (most recent call last):
        ...
        satmon.replaying.user_code.ReplayUsageError: Expected options of ReplayOptions (model, data...), got 'batchs'.
    """
    if options is not None and not isinstance(options, ReplayOptions):
        raise ReplayUsageError(
            f"Expected options to be a ReplayOptions, got {type(options).__name__}: build one with "
            "satmon.replaying.options.ReplayOptions(...) or pass the options by name."
        )
    unknown = [k for k in changes if k not in ReplayOptions.names()]
    if unknown:
        raise ReplayUsageError(
            f"Expected options of ReplayOptions (model, data...), got {', '.join(map(repr, unknown))}."
        )
    return dataclasses.replace(options or ReplayOptions(), **changes)
