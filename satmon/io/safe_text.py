"""Text read from a file, made safe to print: no control character of the file reaches the terminal.

A checkpoint's name, an event file's verdict card or tag, an exception message quoting a file: a hostile file can
hold terminal escape sequences (clear the screen, set the window title, OSC 8 links, OSC 52 clipboard writes, a
forged green "GO" line), carriage returns that overwrite a line, or bidirectional overrides that reorder it.
:func:`printable` escapes every character that is not printable text (C0 and C1 controls, DEL, format characters
such as U+202E, separators other than the space), the way ``ls -b`` shows them, and every byte that is not UTF-8.
"""

from __future__ import annotations

__all__ = ["printable"]


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(s: str, keep: str = "") -> str:
    """``s`` with every character that is not printable text escaped (``\\x1b``, ``\\x9b``, ``\\u202e``), except
    those in ``keep`` (``"\\n"`` for a text of several lines); undecodable bytes of a file name (``os.fsdecode``'s
    surrogates) as ``\\xff``. Printable text, the space included, is left as it is.

    Example:
        >>> printable("run\\x1b]0;pwned\\x07\\rGO")
        'run\\\\x1b]0;pwned\\\\x07\\\\x0dGO'
        >>> printable("card\\n\\u202eog", keep="\\n")
        'card\\n\\\\u202eog'
        >>> printable(b"w\\xff.ckpt".decode("utf-8", "surrogateescape"))
        'w\\\\xff.ckpt'
    """
    if s.isprintable() and not keep:
        return s
    out = []
    for ch in s:
        if ch.isprintable() or ch in keep:
            out.append(ch)
        elif 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(_escape(ch))
    return "".join(out)
