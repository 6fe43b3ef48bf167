"""Import the user's own objects named on the command line (``--model``, ``--factory``, ``--datamodule``).

Importing a module runs its code, so satmon imports only what the user names, the way Python tools
do (``uvicorn``, ``gunicorn``, ``python -m``): ``MODULE:ATTR`` is resolved on the existing
``sys.path`` (the working directory is *not* added: a ``json.py`` or ``tensorboard.py`` lying there
is never picked up), and ``path/to/file.py:ATTR`` loads that one file. Python itself can put the
working directory on ``sys.path`` behind the user's back: an empty ``PYTHONPATH`` entry (``export
PYTHONPATH=$PYTHONPATH:/x`` with it unset), a relative one (``.``, ``src``), or ``python -m``. The
satmon commands run inside :func:`no_working_directory`, which takes those entries off ``sys.path``
for the command's time. Also here: the usage error that every replay module raises (the CLI turns it
into exit code 2).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import itertools
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from satmon.errors import MAX_ERROR, UsageError, error_line  # noqa: F401 - error_line, MAX_ERROR: their home is satmon.errors
from satmon.io.safe_text import printable  # re-exported: the replay's names and errors are printed through it
from satmon.paths import kind_of

__all__ = ["ReplayUsageError", "error_line", "import_object", "no_working_directory", "printable", "short"]


#: The ``sys.path`` entries :func:`no_working_directory` took off, while it is in force (named in import errors).
_IGNORED: list[str] = []


def _read_from_files(entry: str) -> bool:
    """Whether imports read ``entry`` as a path of the file system (a folder or a zip file), not a path hook's key
    (an editable install's ``__editable__...__path_hook__`` entry is one)."""
    finder = sys.path_importer_cache.get(entry)
    if finder is None:
        for hook in sys.path_hooks:
            try:
                finder = hook(entry)
                break
            except ImportError:
                continue
    return (
        finder is None or isinstance(finder, importlib.machinery.FileFinder) or type(finder).__name__ == "zipimporter"
    )


def _from_pythonpath(cwd: str) -> set[str]:
    """The folders an empty or relative ``PYTHONPATH`` entry put on ``sys.path`` (Python makes them absolute, from the
    working directory): ``''`` and ``.`` are the working directory, ``src`` a folder of it. An absolute entry naming
    the same folder is the user's choice, and keeps it."""
    env = "" if sys.flags.ignore_environment else os.environ.get("PYTHONPATH", "")
    given = env.split(os.pathsep) if env else []
    chosen = {os.path.realpath(e) for e in given if os.path.isabs(e)}
    implicit = {os.path.realpath(os.path.join(cwd, e)) for e in given if not os.path.isabs(e)}
    return implicit - chosen


def _names_the_working_directory(entry: str, index: int, cwd: str, implicit: set[str]) -> bool:
    """Whether ``sys.path[index]`` makes the working directory (or a folder of it) importable behind the user's back."""
    if not entry or not os.path.isabs(entry):  # '' and relative entries are looked up from the working directory
        return _read_from_files(entry)
    if os.path.realpath(entry) in implicit:
        return True
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    # python -m satmon... puts the working directory first (no PYTHONSAFEPATH): not an entry the user chose
    started_as_module = spec is not None and str(getattr(spec, "name", "")).startswith("satmon")
    return index == 0 and started_as_module and not sys.flags.safe_path and os.path.realpath(entry) == cwd


@contextmanager
def no_working_directory() -> Iterator[list[str]]:
    """``sys.path`` without the entries that would import from the working directory: ``''`` (``python -c``), the
    folders empty or relative ``PYTHONPATH`` entries named (``''``, ``.``, ``src``: Python made them absolute from the
    working directory), and the working directory ``python -m`` put first; restored at the end. Yields the entries
    taken off.

    An absolute ``PYTHONPATH`` entry is the user's choice and stays, the working directory included
    (``PYTHONPATH=$PWD``).

    Example:
        >>> saved = list(sys.path)
        >>> sys.path[:0] = ["", ".", "src"]
        >>> with no_working_directory() as ignored:
        ...     ignored, "" in sys.path
        (['', '.', 'src'], False)
        >>> sys.path == ["", ".", "src", *saved]
        True
        >>> sys.path[:] = saved
    """
    saved = list(sys.path)
    cwd = os.path.realpath(os.getcwd()) if os.path.isdir(".") else ""
    implicit = _from_pythonpath(cwd) if cwd else set()
    ignored = [
        e for i, e in enumerate(saved) if isinstance(e, str) and _names_the_working_directory(e, i, cwd, implicit)
    ]
    sys.path[:] = [e for e in saved if not (isinstance(e, str) and e in ignored)]
    _IGNORED[:] = ignored
    try:
        yield ignored
    finally:
        _IGNORED.clear()
        sys.path[:] = saved + [e for e in sys.path if e not in saved]  # entries the command added stay, after


class ReplayUsageError(UsageError):
    """The replay's command line, or a user's ``MODULE:ATTR``, cannot work as given: exit code 2 (a
    :class:`satmon.errors.UsageError`, which the grid and the command line raise and catch)."""


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
            raise ReplayUsageError(
                f"{option} {spec}: {source!r} has no attribute {attr!r} (it has {', '.join(public)}...). {hint}."
            )
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
        tip = (
            f" There is a {local} in the working directory, which satmon does not search: pass {option} "
            f"{local}:{spec.rpartition(':')[2]}, or put its folder on PYTHONPATH (as an absolute path)."
            if local.is_file()
            else " The working directory is not searched: install the package, set PYTHONPATH, or pass the file path."
        )
        if _IGNORED:
            tip += (
                f" (satmon ignored the sys.path entries {', '.join(repr(e) for e in _IGNORED[:4])}: they name the "
                "working directory or a folder of it, from an empty, '.' or relative PYTHONPATH entry or python -m; "
                "give PYTHONPATH absolute paths.)"
            )
        raise ReplayUsageError(f"{option} {spec}: cannot import module {name!r} ({e}).{tip} {hint}.") from e
    except Exception as e:  # the user's module raised while importing
        raise ReplayUsageError(f"{option} {spec}: importing {name!r} failed: {error_line(e)}") from e


def _load_file(source: str, option: str, spec: str, hint: str) -> Any:
    path = Path(source)
    if path.suffix != ".py":
        raise ReplayUsageError(f"{option} {spec}: expected a path to a .py file, got {source!r}. {hint}.")
    kind = kind_of(path)  # by lstat/stat: a FIFO named like a .py file would block the import forever
    if kind.kind == "missing":
        raise ReplayUsageError(f"{option} {spec}: no such file {source!r}. {hint}.")
    if not kind.regular:
        raise ReplayUsageError(
            f"{option} {spec[:240]}: expected a regular .py file, got {kind.describe()} (it was not opened). {hint}."
        )
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
