"""Importing user objects: ``MODULE:ATTR`` from the existing sys.path only (never the working directory),
``path/to/file.py:ATTR`` loaded explicitly, and one clear error per mistake."""

from __future__ import annotations

import json
import sys

import pytest

from satmon.replaying.user_code import ReplayUsageError, error_line, import_object


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A working directory holding look-alike modules, and a package folder on sys.path (as if installed)."""
    cwd, site = tmp_path / "cwd", tmp_path / "site"
    cwd.mkdir()
    (site / "userpkg_a1").mkdir(parents=True)
    marker = tmp_path / "shadow_ran"
    # in the working directory: a module with the name of the user's dependency, which must never run
    (cwd / "satmon_dep_a1.py").write_text(f"open({str(marker)!r}, 'a').write('dep\\n')\nVALUE = 'shadow'\n")
    (site / "satmon_dep_a1.py").write_text("VALUE = 'real'\n")
    (site / "userpkg_a1" / "__init__.py").write_text(
        "import satmon_dep_a1\nclass Net:\n    dep = satmon_dep_a1.VALUE\n"
    )
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", [str(site)] + [p for p in sys.path if p not in ("", ".")])
    for name in ("satmon_dep_a1", "userpkg_a1"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return cwd, site, marker


def test_module_attr_resolves_on_sys_path_not_the_working_directory(isolated):
    cwd, _, marker = isolated
    net = import_object("userpkg_a1:Net", "--model")
    assert net.dep == "real"  # the installed dependency, not the look-alike in the working directory
    assert not marker.exists()
    assert str(cwd) not in sys.path and "" not in sys.path


def test_module_only_in_the_working_directory_is_not_imported_and_the_error_says_how(isolated):
    cwd, _, marker = isolated
    (cwd / "mymodels_a1.py").write_text(f"open({str(marker)!r}, 'a').write('x')\ndef build(): pass\n")
    with pytest.raises(ReplayUsageError) as e:
        import_object("mymodels_a1:build", "--factory")
    msg = str(e.value)
    assert "cannot import module 'mymodels_a1'" in msg and "--factory mymodels_a1.py:build" in msg
    assert not marker.exists()


def test_file_path_form_loads_that_file_without_replacing_an_installed_module(tmp_path):
    (tmp_path / "json.py").write_text("def build():\n    return 42\n")  # named like the standard library module
    build = import_object(f"{tmp_path / 'json.py'}:build", "--factory")
    assert build() == 42
    assert sys.modules["json"] is json and json.dumps([1]) == "[1]"
    assert build.__module__.startswith("satmon_user_code_json_")


def test_file_path_form_with_a_dotted_attribute(tmp_path):
    (tmp_path / "m.py").write_text("class Outer:\n    class Inner:\n        x = 3\n")
    assert import_object(f"{tmp_path}/m.py:Outer.Inner").x == 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("satmon.demos.lit", "Expected --model as MODULE:ATTR or path/to/file.py:ATTR, got 'satmon.demos.lit'"),
        ("satmon.demos.lit:", "Expected --model as MODULE:ATTR"),
        ("satmon.demos.lit:1x", "Expected --model as MODULE:ATTR"),
        ("no_such_module_xyz:Net", "cannot import module 'no_such_module_xyz'"),
        ("satmon.demos.lit:NoSuchClass", "has no attribute 'NoSuchClass'"),
        ("not a module:X", "is neither a dotted module name nor a .py file"),
        ("missing/file.py:X", "no such file 'missing/file.py'"),
        ("some/dir:X", "expected a path to a .py file"),
    ],
)
def test_errors_name_the_option_and_the_expected_form(spec, message):
    with pytest.raises(ReplayUsageError) as e:
        import_object(spec, "--model")
    assert message in str(e.value) and "--model" in str(e.value)


def test_errors_raised_by_the_user_module_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "boom.py").write_text("raise RuntimeError('bad config\\nsecond line')\n")
    (tmp_path / "needs_dep_a1.py").write_text("import no_such_dependency_a1\n")
    with pytest.raises(ReplayUsageError, match=r"running .*boom.py' failed: RuntimeError: bad config$"):
        import_object(f"{tmp_path}/boom.py:x", "--factory")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ReplayUsageError,
        match="importing 'needs_dep_a1' failed: ModuleNotFoundError: No module named 'no_such_dependency_a1'",
    ):
        import_object("needs_dep_a1:x", "--factory")


def test_error_line():
    assert error_line(KeyError("k")) == "KeyError: 'k'"
    assert (
        error_line(RuntimeError("Error(s) in loading:\n\tsize mismatch for w\nmore"))
        == "RuntimeError: Error(s) in loading: size mismatch for w"
    )
