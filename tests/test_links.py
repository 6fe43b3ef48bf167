"""Every relative markdown link in README.md and docs/**/*.md resolves: the file exists and a ``#anchor`` names a
heading of the page it points to (GitHub's slugs: lower case, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _slugs(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        base, n = slug, 1
        while slug in out:
            slug, n = f"{base}-{n}", n + 1
        out.add(slug)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in _slugs(dest):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


#: A repository path written out in prose or code (``docs/science/science.md``, ``data/grid2.json``).
_PATH = re.compile(r"(?<![\w./-])((?:docs|data)/[\w./-]*\w\.(?:md|json|csv|txt|png))")
#: What names repository paths for a reader: the package (docstrings, messages, data-file comments), the docs, the
#: examples and benchmarks. Grid and cell JSON under data/ are records of past runs, kept as written.
_NAMING = [
    *sorted((ROOT / "satmon").rglob("*.py")),
    *sorted((ROOT / "satmon" / "data_files").glob("*.csv")),
    *PAGES,
    *sorted((ROOT / "examples").glob("*.py")),
    *sorted((ROOT / "benchmarks").glob("*.py")),
]


def test_every_repository_path_the_package_and_docs_name_exists() -> None:
    """A file moved (docs/ into folders, data out of docs/) leaves no mention of its old place behind."""
    missing = sorted(
        {
            f"{f.relative_to(ROOT)}: {p}"
            for f in _NAMING
            for p in _PATH.findall(f.read_text(encoding="utf-8", errors="replace"))
            if not (ROOT / p).exists()
        }
    )
    assert not missing, f"paths named that do not exist: {missing}"
