"""README's block of what GO / NO-GO and the collapse watch say and are worth, rendered from ``satmon.study``.

README.md holds, between ``<!-- satmon.study:worth -->`` and ``<!-- /satmon.study -->``, exactly what :func:`render`
returns: the words of :data:`satmon.study.MEANING`, :data:`satmon.study.WORTH` and
:data:`satmon.study.COLLAPSE_WORTH`, never a count restated by hand. ``tests/test_readme.py`` fails when they differ;

    python .ci/readme_study.py            # rewrites the block in README.md (after satmon.study changed)
    python .ci/readme_study.py --check    # exit 1 when README.md's block is not what satmon.study renders
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- satmon.study:worth (written by `python .ci/readme_study.py` from satmon.study: do not edit by hand) -->"
END = "<!-- /satmon.study -->"
WIDTH = 118


def _item(label: str, text: str) -> str:
    """One markdown list item: ``- **label**: Text.`` wrapped at :data:`WIDTH`, continuation lines indented."""
    sentence = text[0].upper() + text[1:]
    sentence = sentence if sentence.endswith(".") else sentence + "."
    return textwrap.fill(
        f"- **{label}**: {sentence}",
        width=WIDTH,
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def render() -> str:
    """The block, markers included, from ``satmon.study`` as it is now."""
    from satmon import study

    items = [
        _item("GO", study.MEANING["go"]),
        _item("NO-GO", study.MEANING["no-go"]),
        _item("What a decision is worth", study.WORTH),
        _item("The collapse watch", study.COLLAPSE_WORTH),
    ]
    return "\n".join([BEGIN, *items, END])


def block(text: str) -> str:
    """README's block as it stands, markers included (``ValueError`` when a marker is missing or out of order)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(
            f"Expected README.md to hold {BEGIN!r} ... {END!r} once, in that order; got "
            f"begin at {start}, end at {end}. Put the two markers back, then run python .ci/readme_study.py"
        )
    return text[start : end + len(END)]


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    now, want = block(text), render()
    if "--check" in argv:
        if now != want:
            print(
                "README.md's satmon.study block differs from what satmon.study renders: run python .ci/readme_study.py",
                file=sys.stderr,
            )
            return 1
        return 0
    if now != want:
        tmp = README.with_name(README.name + ".tmp")
        tmp.write_text(text.replace(now, want), encoding="utf-8")
        tmp.replace(README)  # README is replaced only by a complete file
        print("README.md: the satmon.study block rewritten")
    else:
        print("README.md: the satmon.study block is up to date")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this clone's satmon, whatever is installed
    sys.exit(main(sys.argv[1:]))
