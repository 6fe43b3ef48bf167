"""The tree shows the layers, and the imports keep to them (docs/architecture.md draws the same table).

Every ``import`` in satmon's code, lazy ones inside functions included, is read from the source and
checked against what its layer may use: layers call only downward. Lightning and transformers are
imported only by the drivers, the Lightning sink, the demos and the demo command.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "satmon"

#: The layers, bottom up. A unit may import itself and every unit in a lower layer, nothing above.
LAYERS: list[tuple[str, ...]] = [
    ("satmon._version", "satmon._compat", "satmon.study", "satmon.paths", "satmon.functional"),
    ("satmon.results", "satmon.batches", "satmon.dyt"),
    ("satmon.settings",),
    ("satmon.model",),
    ("satmon.convert", "satmon.observe", "satmon.io"),
    ("satmon.screen", "satmon.probing", "satmon.calibrate"),
    ("satmon.replay",),
    ("satmon.drivers", "satmon.demos"),
    ("satmon.cli",),
]
#: Units of one layer that may use another of the same layer.
SIDEWAYS = {("satmon.observe", "satmon.io"): False}
#: Third-party frameworks and who may import them.
FRAMEWORKS = {
    "lightning": ("satmon.drivers.lightning", "satmon.drivers.live_probe", "satmon.io.lightning", "satmon.demos",
                  "satmon.cli.demo"),
    "transformers": ("satmon.drivers.hf",),
}
ROOT_MODULES_ALLOWED = 6  # besides __init__, _version and _compat
#: Imports that break the rules today, each with the change that removes it. Empty when the house is in order.
KNOWN = {
}


def _unit(module: str) -> str:
    for layer in LAYERS:
        for unit in layer:
            if module == unit or module.startswith(unit + "."):
                return unit
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and to docs/architecture.md")


def _rank(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = module.split(".")[: -node.level if path.name != "__init__.py" else len(module.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            if target == "satmon":  # from satmon import x: x is a module or a public name
                found += [(node.lineno, f"satmon.{a.name}") for a in node.names if (PACKAGE / a.name).exists()
                          or (PACKAGE / f"{a.name}.py").exists()]
    return found


MODULES = [(m, p) for m, p in _modules() if m not in ("satmon", "satmon._compat")]


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_imports_go_only_downward(module, path):
    unit = _unit(module)
    bad = []
    for line, target in _imports(path, module):
        if target == "satmon" or not target.startswith("satmon."):
            continue
        other = _unit(target)
        if other == unit or (module, target) in KNOWN:
            continue
        if _rank(other) > _rank(unit) or (_rank(other) == _rank(unit) and not SIDEWAYS.get((unit, other), False)):
            bad.append(f"line {line}: {target} ({other} is not below {unit})")
    assert not bad, f"{module} imports upward or sideways:\n" + "\n".join(bad)


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_frameworks_are_imported_only_by_their_drivers(module, path):
    for line, target in _imports(path, module):
        top = target.split(".")[0]
        if top in FRAMEWORKS and (module, target) not in KNOWN:
            allowed = FRAMEWORKS[top]
            assert any(module == a or module.startswith(a + ".") for a in allowed), (
                f"{module} line {line} imports {target}; only {allowed} may")


def test_the_package_root_holds_few_modules():
    root = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "_version", "_compat"))
    assert len(root) <= ROOT_MODULES_ALLOWED, root


def test_functional_imports_nothing_of_satmon_outside_itself():
    for module, path in _modules():
        if module.startswith("satmon.functional"):
            outside = [t for _, t in _imports(path, module) if t.startswith("satmon") and not t.startswith("satmon.functional")]
            assert not outside, (module, outside)
