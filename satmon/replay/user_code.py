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
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["ReplayUsageError", "error_line", "import_object"]


class ReplayUsageError(ValueError):
    """The command line cannot work as given (wrong ``MODULE:ATTR``, missing data...): exit code 2."""


def error_line(e: BaseException) -> str:
    """``Type: first line`` of an exception (and the next line when the first only announces it).

    Example:
        >>> error_line(ValueError("bad value\\nmore detail"))
        'ValueError: bad value'
    """
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    return f"{type(e).__name__}: {text}".rstrip(": ")


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
