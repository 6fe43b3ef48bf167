"""The user-error vocabulary: what satmon raises and prints when a command, an option or a user's file cannot work.

:class:`UsageError` is input the user can fix (a wrong ``MODULE:ATTR``, missing data, an option out of range): the
replay, the grid and the command line raise it, and the command line answers it with one line and exit code 2
(``satmon.cli.main``). The replay's own, :class:`satmon.replaying.user_code.ReplayUsageError`, is one.
:func:`error_line` is how any exception is said in one line, bounded (:data:`MAX_ERROR`) and with no control
character (a message may quote a file).

Example:
    >>> try:
    ...     raise UsageError("Expected --threads >= 1, got 0.")
    ... except ValueError as e:  # a UsageError is a ValueError
    ...     error_line(e)
    'UsageError: Expected --threads >= 1, got 0.'
"""

from __future__ import annotations

from satmon.io.safe_text import printable

__all__ = ["MAX_ERROR", "UsageError", "error_line"]

#: The longest error line satmon prints for one exception (a crafted file cannot flood the console).
MAX_ERROR = 400


class UsageError(ValueError):
    """The command cannot work as given (wrong ``MODULE:ATTR``, missing data, an option out of range): exit code 2.
    The message says "Expected X, got Y" and what to do."""


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
    line = printable(f"{type(e).__name__}: {text}".rstrip(": "))  # a message may quote a file: no control character
    return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 3] + "..."
