"""The DeepSpeed checkpoint folder format, which satmon does not read: recognised, and named once with the commands
that consolidate it into a file satmon reads (its weights are ZeRO-partitioned across the ranks' optimizer files,
in DeepSpeed's own objects: consolidating them needs deepspeed).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from satmon.replaying.file_info import FileStamp
from satmon.replaying.formats.common import (
    CheckpointFormat,
    CheckpointInfo,
    Entries,
    Match,
    converted_path,
)
from satmon.replaying.user_code import printable

__all__ = ["FORMAT", "inspect", "recognise", "unsupported_format"]

_DEEPSPEED_MODEL = re.compile(r"(zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt")


_DEEPSPEED_OPTIM = re.compile(r"(bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt")


def unsupported_format(folder: Path, names: set[str], subfolders: Sequence[Path] = ()) -> str | None:
    """Why ``folder`` (holding the files ``names`` and the folders ``subfolders``) is a checkpoint in a format satmon
    does not read, with the command that makes a file it reads; ``None`` when it is not one.

    DeepSpeed (Lightning's ``DeepSpeedStrategy`` included): ``latest``, ``zero_to_fp32.py`` and a tag folder of
    ``mp_rank_*_model_states.pt`` and ``zero_*_optim_states.pt`` (the tag folder itself when given). Its weights are
    partitioned across the ranks' optimizer files (ZeRO), in DeepSpeed's own objects: consolidating them needs
    deepspeed. (A torch.distributed.checkpoint folder is read: :mod:`satmon.replaying.formats.dcp`.)

    Example:
        >>> print(unsupported_format(Path("run/ds"), {"mp_rank_00_model_states.pt"}).split(":")[0])
        a DeepSpeed checkpoint folder (mp_rank_*_model_states.pt, ZeRO-partitioned zero_*_optim_states.pt beside it)
    """
    tag = None
    if any(_DEEPSPEED_MODEL.fullmatch(n) or _DEEPSPEED_OPTIM.fullmatch(n) for n in names):
        tag = folder
    elif "latest" in names or "zero_to_fp32.py" in names:
        for sub in subfolders:
            try:
                if any(
                    _DEEPSPEED_MODEL.fullmatch(e.name) or _DEEPSPEED_OPTIM.fullmatch(e.name) for e in os.scandir(sub)
                ):
                    tag = sub
                    break
            except OSError:
                continue
    if tag is None:
        return None
    root = folder if tag is not folder else tag.parent
    where = f"{printable(tag.name)}/mp_rank_*_model_states.pt" if tag is not folder else "mp_rank_*_model_states.pt"
    code = (
        "from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict as c; "
        f"c({str(root)!r}, {str(converted_path(root, '.ckpt'))!r})"
    )
    lightning = f"python -c {shlex.quote(code)}"
    script = " ".join(shlex.quote(str(p)) for p in (root / "zero_to_fp32.py", root, converted_path(root, ".pt")))
    return printable(
        f"a DeepSpeed checkpoint folder ({where}, ZeRO-partitioned zero_*_optim_states.pt beside it): "
        "satmon reads single-file checkpoints; consolidate it first (both ways need the deepspeed package): "
        f"for a Lightning run `{lightning}` makes a .ckpt for --model, else `python {script}` (DeepSpeed's "
        "script saved with the checkpoint: it is code, run it only for a folder you trust) makes a "
        "state_dict for --factory; then replay that file"
    )


def recognise(path: Path, entries: Entries | None) -> Match | None:
    """A DeepSpeed folder (or its tag folder): one checkpoint satmon does not read, nothing under it searched."""
    why = None if entries is None else unsupported_format(path, set(entries.names), entries.folders)
    return None if why is None else Match(used=entries.names, whole=True, unsupported=why)


def inspect(folder: Path, trust: bool = False, stamps: Sequence[FileStamp] | None = None) -> CheckpointInfo:
    """A DeepSpeed folder, named with its conversion (never read)."""
    match = recognise(folder, Entries.of(folder))
    why = match.unsupported if match is not None else "not a DeepSpeed checkpoint folder"
    return CheckpointInfo(path=folder, error=why, format=FORMAT.name)


#: The DeepSpeed folder format (recognised, not read).
FORMAT = CheckpointFormat("DeepSpeed folder", recognise, inspect)
