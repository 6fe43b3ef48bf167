"""Bounded work before refusal: a file's declared sizes are checked against a budget before anything is inflated
or allocated.

A checkpoint says how big its parts are before they are read: a zip archive's central directory records each
record's uncompressed size, a pickle's ``FRAME``, ``BINBYTES8``, ``BINUNICODE8``... opcodes declare the length that
follows, and the pickle declares each tensor storage's size. A crafted file can declare far more than it holds: a
1 MB file whose pickle inflates to 1 GB brought satmon 0.4 to 3.4 GB resident before it was refused. So, before
torch reads a file:

* every zip record that is not tensor data (the pickle, ``version``, ``byteorder``...) must declare at most the
  **pickle budget** uncompressed: 64 MiB by default (a Lightning checkpoint's pickle of a GPT-2-sized model,
  optimizer state included, is under 1 MiB), raised with the environment variable ``SATMON_MAX_PICKLE_MB``;
* every tensor record must lie inside the file (stored as ``torch.save`` writes it: it cannot hold more bytes
  than the file), and so must the storages a pickle declares (their sum at most the file's size);
* a legacy (pre-zip) file's pickles are scanned opcode by opcode, without reading their payloads, and each
  declared length must fit what is left of the file and of the budget (:func:`pickle_extent`).

Unpickling costs a few times the pickle's size in memory, so the budget bounds the peak: a file over it is
refused with its declared size, the budget and how to raise it, having read only the zip directory (or the
opcodes' headers).
"""

from __future__ import annotations

import os
import pickletools
import zipfile
from collections.abc import Iterable
from typing import IO, Any

__all__ = [
    "BUDGET_ENV",
    "DEFAULT_PICKLE_MB",
    "OverBudget",
    "check_archive",
    "check_storages",
    "legacy_storage_claims",
    "mib",
    "pickle_budget",
    "pickle_extent",
]

#: The environment variable that raises (or lowers) the pickle budget, in MiB.
BUDGET_ENV = "SATMON_MAX_PICKLE_MB"
#: The pickle budget when :data:`BUDGET_ENV` is not set, in MiB.
DEFAULT_PICKLE_MB = 64


class OverBudget(ValueError):
    """A file that declares more than satmon reads before it can check it; the message says the
    budget and how to raise it."""


def pickle_budget() -> int:
    """The pickle budget in bytes: :data:`BUDGET_ENV` MiB when set, else :data:`DEFAULT_PICKLE_MB` MiB.

    Raises:
        ValueError: :data:`BUDGET_ENV` is not a positive number.

    Example:
        >>> import os
        >>> os.environ.pop(BUDGET_ENV, None) is None or True
        True
        >>> pickle_budget() == 64 * 2**20
        True
    """
    raw = os.environ.get(BUDGET_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_PICKLE_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        mb = float("nan")
    if not mb > 0 or mb == float("inf"):
        raise ValueError(
            f"Expected {BUDGET_ENV} to be a positive number of MiB (e.g. 256), got {raw[:40]!r}: fix or unset it."
        )
    return int(mb * 2**20)


def mib(n: int) -> str:
    """``n`` bytes in MiB, as the budget is given (``"64 MiB"``, ``"0.01 MiB"``)."""
    return f"{n / 2**20:,.0f} MiB" if n >= 10 << 20 else f"{n / 2**20:.3g} MiB"


def _over(what: str, declared: int, budget: int) -> OverBudget:
    return OverBudget(
        f"over satmon's read budget: {what} declares {declared:,} bytes, over the {mib(budget)} "
        "satmon reads of a checkpoint's pickle (a checkpoint's pickle holds no tensor data); refused "
        f"unread. For a file you trust that needs more, set {BUDGET_ENV}=N (MiB)"
    )


def check_archive(z: zipfile.ZipFile, size: int, budget: int | None = None) -> None:
    """Check a torch zip archive's declared sizes (from its central directory: nothing is inflated).

    Args:
        z: the open archive (its directory read).
        size: the file's size in bytes.
        budget: the pickle budget in bytes (default :func:`pickle_budget`).

    Raises:
        OverBudget: a record that is not tensor data declares more than the budget; or tensor records that claim
            more bytes than the file holds.

    Example:
        >>> import io
        >>> buf = io.BytesIO()
        >>> with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as w:
        ...     w.writestr("archive/data.pkl", b"\\x00" * 5000)
        >>> check_archive(zipfile.ZipFile(buf), len(buf.getvalue()), budget=4096)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        satmon.replaying.budget.OverBudget: over satmon's read budget: its record 'archive/data.pkl' (... bytes
        compressed) declares 5,000 bytes...
    """
    budget = pickle_budget() if budget is None else budget
    data = 0
    for info in z.infolist():
        parts = info.filename.split("/")
        if len(parts) >= 2 and parts[-2] == "data":
            data += info.file_size
            if info.compress_type == zipfile.ZIP_STORED and info.header_offset + info.file_size > size:
                raise OverBudget(
                    f"over satmon's read budget: its tensor record {info.filename[-80:]!r} declares "
                    f"{info.file_size:,} bytes at byte {info.header_offset:,}, past the end of the "
                    f"{size:,}-byte file: a crafted or cut-short archive; refused unread"
                )
            continue
        if info.file_size > budget:
            raise _over(
                f"its record {info.filename[-80:]!r} ({info.compress_size:,} bytes compressed)", info.file_size, budget
            )
    if data > size + budget:  # torch.save stores tensors uncompressed: they cannot hold more than the file
        raise OverBudget(
            f"over satmon's read budget: its tensor records declare {data:,} bytes in a {size:,}-byte file "
            "(torch.save stores tensors uncompressed): a crafted archive; refused unread"
        )


def check_storages(storages: Iterable[Any], size: int, legacy: bool = False) -> None:
    """The storages a pickle declares (meta tensors' storages, each counted once) must fit in the file's ``size``
    bytes, before any is allocated.

    A zip archive's storages are counted once each by their record; a legacy file's views of a storage are storages of
    their own as torch reads them (a slice of their root, whose bytes are in the file once), so they may add up to twice
    the file's size: what a crafted legacy file can make torch allocate stays proportional to its size.

    Raises:
        OverBudget: they declare more bytes than that.
    """
    seen: dict[Any, int] = {}
    for storage in storages:
        key = getattr(storage, "_checkpoint_offset", None)
        seen.setdefault(key if key is not None else ("cdata", storage._cdata), storage.nbytes())
    total, allowed = sum(seen.values()), size * (2 if legacy else 1)
    if total > allowed:
        raise OverBudget(
            f"over satmon's read budget: its pickle declares tensor storages of {total:,} bytes in a "
            f"{size:,}-byte file (their bytes would have to be in it): a crafted or cut-short file; refused "
            "before anything was allocated"
        )


def legacy_storage_claims(f: IO[bytes]) -> int | None:
    """The bytes of the storages a legacy file's object pickle (at ``f``'s position) declares, each root storage once,
    read with torch's weights-only unpickler and every storage on the meta device (nothing allocated); ``None`` when
    that unpickler refuses the pickle (``torch.load`` then refuses it too, or runs it only when trusted).

    torch reads a legacy file's storages by allocating each declared size on the CPU before it reads the bytes, even
    for ``map_location="meta"``: the sizes must be known first.
    """
    import torch
    from torch import _weights_only_unpickler

    claims: dict[Any, int] = {}

    def persistent_load(saved_id: Any) -> Any:
        if not (isinstance(saved_id, tuple) and len(saved_id) == 6 and saved_id[0] in ("storage", b"storage")):
            raise pickle_error(f"an unexpected storage id {type(saved_id).__name__}")
        _, storage_type, root_key, _, numel, _ = saved_id
        dtype = storage_type.dtype
        nbytes = int(numel) * torch._utils._element_size(dtype)
        claims[root_key] = max(claims.get(root_key, 0), nbytes)
        return torch.storage.TypedStorage(
            wrap_storage=torch.UntypedStorage(nbytes, device="meta"), dtype=dtype, _internal=True
        )

    unpickler = _weights_only_unpickler.Unpickler(f, encoding="utf-8")
    unpickler.persistent_load = persistent_load
    try:
        unpickler.load()
    except Exception:
        return None
    return sum(claims.values())


def pickle_error(what: str) -> ValueError:
    return ValueError(f"not a checkpoint: {what} in its pickle")


_OPCODES = {op.code.encode("latin-1"): op for op in pickletools.opcodes}
_LENGTH = {
    pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
    pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
    pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
    pickletools.TAKEN_FROM_ARGUMENT8U: (8, False),
}


def pickle_extent(f: IO[bytes], end: int, budget: int | None = None) -> int:
    """The length of the pickle at ``f``'s position (up to its ``STOP``), found by reading opcode headers only.

    Each length an opcode declares (a ``FRAME``, ``BINBYTES8``, ``BINUNICODE``, ``LONG4``...) is checked against
    the bytes left before ``end`` and the budget before anything is skipped; payloads are skipped, never read.

    Raises:
        OverBudget: the pickle, or a length it declares, is over the budget or past ``end``.
        ValueError: not a pickle, or cut short.

    Example:
        >>> import io, pickle
        >>> raw = pickle.dumps({"a": [1, 2.5, "x" * 100]}, protocol=4)
        >>> pickle_extent(io.BytesIO(raw + b"tail"), len(raw) + 4) == len(raw)
        True
    """
    budget = pickle_budget() if budget is None else budget
    start = f.tell()
    limit = min(end, start + budget)
    while True:
        at = f.tell()
        code = f.read(1)
        if not code:
            raise ValueError(f"not a checkpoint: a pickle cut short at byte {at:,}")
        op = _OPCODES.get(code)
        if op is None:
            raise ValueError(f"not a checkpoint: byte {code!r} at {at:,} is no pickle opcode")
        arg = op.arg
        if arg is not None:
            if arg.n >= 0:
                raw = f.read(arg.n)
                if len(raw) < arg.n:
                    raise ValueError(f"not a checkpoint: a pickle cut short at byte {at:,}")
                if op.name == "FRAME":
                    n = int.from_bytes(raw, "little")
                    if f.tell() + n > limit:
                        raise (
                            _over(f"a pickle FRAME at byte {at:,}", n, budget)
                            if f.tell() + n <= end
                            else ValueError(
                                f"not a checkpoint: a pickle FRAME at byte {at:,} declares {n:,} "
                                "bytes past the end of the file"
                            )
                        )
            elif arg.n == pickletools.UP_TO_NEWLINE:
                for _ in range(2 if arg.name == "stringnl_noescape_pair" else 1):
                    line = f.readline(min(1 << 16, max(limit - f.tell(), 0)) + 1)
                    if not line.endswith(b"\n"):
                        raise ValueError(f"not a checkpoint: a pickle line at byte {at:,} without its end")
            else:
                width, signed = _LENGTH[arg.n]
                raw = f.read(width)
                n = int.from_bytes(raw, "little", signed=signed)
                if len(raw) < width or n < 0:
                    raise ValueError(f"not a checkpoint: a pickle length at byte {at:,} cut short or negative")
                if f.tell() + n > limit:
                    if f.tell() + n > end:
                        raise ValueError(
                            f"not a checkpoint: pickle opcode {op.name} at byte {at:,} declares {n:,} "
                            "bytes past the end of the file"
                        )
                    raise _over(f"pickle opcode {op.name} at byte {at:,}", n, budget)
                f.seek(n, os.SEEK_CUR)
        if f.tell() > limit:
            if f.tell() > end:
                raise ValueError(f"not a checkpoint: a pickle cut short at byte {end:,}")
            raise _over("its pickle", f.tell() - start, budget)
        if op.name == "STOP":
            return f.tell() - start
