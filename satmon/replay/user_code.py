"""Import the user's own objects named on the command line (``--model``, ``--factory``, ``--datamodule``).

Importing a module runs its code, so satmon imports only what the user names, the way Python tools
do (``uvicorn``, ``gunicorn``, ``python -m``): ``MODULE:ATTR`` is resolved on the existing
``sys.path`` (the working directory is *not* added: a ``json.py`` or ``tensorboard.py`` lying there
is never picked up), and ``path/to/file.py:ATTR`` loads that one file. Also here: the usage error
that every replay module raises (the CLI turns it into exit code 2).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import itertools
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ReplayUsageError", "error_line", "import_object", "printable", "short"]

#: The longest error line satmon prints for one exception (a crafted file cannot flood the console).
MAX_ERROR = 400


class ReplayUsageError(ValueError):
    """The command line cannot work as given (wrong ``MODULE:ATTR``, missing data...): exit code 2."""


def error_line(e: BaseException) -> str:
    """``Type: first line`` of an exception (and the next line when the first only announces it), at most
    :data:`MAX_ERROR` characters.

    Example:
        >>> error_line(ValueError("bad value\\nmore detail"))
        'ValueError: bad value'
    """
    try:
        raw = str(e)[: 20 * MAX_ERROR]
    except Exception:  # an exception whose message cannot be formatted (a crafted value inside it)
        raw = ""
    lines = [ln.strip() for ln in raw.strip().splitlines() if ln.strip()]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    line = f"{type(e).__name__}: {text}".rstrip(": ")
    return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 3] + "..."


def short(obj: Any, width: int = 200) -> str:
    """A bounded representation of a value read from a file: two levels deep, six items a container, 60
    characters a string; other objects by type name only (their own ``repr`` is never called).

    Example:
        >>> deep = []
        >>> for _ in range(60_000):
        ...     deep = [deep]
        >>> short({"seq_len": 64, "blob": deep, "name": "x" * 100})
        "{'seq_len': 64, 'blob': [[...]], 'name': 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'...}"
    """

    def fmt(o: Any, depth: int) -> str:
        if o is None or isinstance(o, (bool, float)):
            return repr(o)
        if isinstance(o, int):
            return repr(o) if abs(o) < 10**30 else f"<int of {o.bit_length()} bits>"
        if isinstance(o, (str, bytes)):
            return repr(o[:60]) + ("..." if len(o) > 60 else "")
        if type(o).__name__ == "Tensor" or hasattr(o, "shape") and hasattr(o, "dtype"):
            return f"<tensor {tuple(getattr(o, 'shape', ()))} {getattr(o, 'dtype', '')}>"
        if isinstance(o, Mapping):
            if depth == 0:
                return "{...}"
            items = [f"{fmt(k, depth - 1)}: {fmt(v, depth - 1)}" for k, v in itertools.islice(o.items(), 6)]
            return "{" + ", ".join(items) + (", ..." if len(o) > 6 else "") + "}"
        if isinstance(o, (list, tuple)):
            left, right = ("[", "]") if isinstance(o, list) else ("(", ")")
            if depth == 0:
                return left + "..." + right
            items = [fmt(v, depth - 1) for v in o[:6]]
            return left + ", ".join(items) + (", ..." if len(o) > 6 else "") + right
        return f"<{type(o).__name__}>"

    text = fmt(obj, 2)
    return text if len(text) <= width else text[: width - 3] + "..."


def printable(s: str) -> str:
    """``s`` as text every output can encode: a file name's undecodable bytes (``os.fsdecode``'s surrogates, from a
    name that is not UTF-8) written as ``\\xff``, as ``ls -b`` shows them (TensorBoard, JSON and markdown need UTF-8).

    Example:
        >>> printable(b"w\\xff.ckpt".decode("utf-8", "surrogateescape"))
        'w\\\\xff.ckpt'
    """
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def import_object(spec: str, option: str = "--model", example: str = "mypkg.model:Net") -> Any:
    """The object ``spec`` names: ``MODULE:ATTR`` (``MODULE`` importable from ``sys.path``) or ``path/to/file.py:ATTR``.

    ``ATTR`` may be dotted (``module:Outer.Inner``). A file is loaded under a private module name
    (``satmon_user_code_<stem>_<hash>``), so it never replaces an installed module of the same name.

    Args:
        spec: what the user passed.
        option: the command-line option, named in errors.
        example: a valid value for ``option``, shown in errors.

    Raises:
        ReplayUsageError: malformed ``spec``, a module that cannot be imported (or raised while
            importing), no such file or attribute.

    Example:
        >>> import_object("satmon.demos.lit:LitLM", "--model").__name__
        'LitLM'
    """
    hint = f"Pass {option} MODULE:ATTR (MODULE importable, e.g. {example}) or {option} path/to/file.py:ATTR"
    source, sep, attr = spec.rpartition(":")  # rpartition: a Windows path keeps its drive colon
    if not sep or not source or not attr or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", attr):
        raise ReplayUsageError(f"Expected {option} as MODULE:ATTR or path/to/file.py:ATTR, got {spec!r}. {hint}.")
    if source.endswith(".py") or "/" in source or "\\" in source:
        module = _load_file(source, option, spec, hint)
    else:
        module = _import_module(source, option, spec, hint)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))[:15]
            raise ReplayUsageError(f"{option} {spec}: {source!r} has no attribute {attr!r} "
                                   f"(it has {', '.join(public)}...). {hint}.")
        obj = getattr(obj, part)
    return obj


def _import_module(name: str, option: str, spec: str, hint: str) -> Any:
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        raise ReplayUsageError(f"{option} {spec}: {name!r} is neither a dotted module name nor a .py file. {hint}.")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not (name == e.name or name.startswith(e.name + ".")):  # it imports something missing
            raise ReplayUsageError(f"{option} {spec}: importing {name!r} failed: {error_line(e)}") from e
        local = Path(*name.split(".")).with_suffix(".py")
        tip = (f" There is a {local} in the working directory, which satmon does not search: pass {option} "
               f"{local}:{spec.rpartition(':')[2]}, or put its folder on PYTHONPATH." if local.is_file() else
               " The working directory is not searched: install the package, set PYTHONPATH, or pass the file path.")
        raise ReplayUsageError(f"{option} {spec}: cannot import module {name!r} ({e}).{tip} {hint}.") from e
    except Exception as e:  # the user's module raised while importing
        raise ReplayUsageError(f"{option} {spec}: importing {name!r} failed: {error_line(e)}") from e


def _load_file(source: str, option: str, spec: str, hint: str) -> Any:
    path = Path(source)
    if path.suffix != ".py":
        raise ReplayUsageError(f"{option} {spec}: expected a path to a .py file, got {source!r}. {hint}.")
    if not path.is_file():
        raise ReplayUsageError(f"{option} {spec}: no such file {source!r}. {hint}.")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]  # two model.py files stay two modules
    name = f"satmon_user_code_{path.stem}_{digest}"
    loaded = importlib.util.spec_from_file_location(name, path)
    if loaded is None or loaded.loader is None:
        raise ReplayUsageError(f"{option} {spec}: Python cannot load {source!r} as a module. {hint}.")
    module = importlib.util.module_from_spec(loaded)
    sys.modules[name] = module  # classes defined in the file (dataclasses, pickling) look their module up here
    try:
        loaded.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise ReplayUsageError(f"{option} {spec}: running {source!r} failed: {error_line(e)}") from e
    return module
