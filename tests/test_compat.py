"""satmon 0.2's import paths still work until 0.5, with a warning naming the new home; 0.1's are gone.

These are the only tests that import deprecated paths: everywhere else pyproject turns satmon's own
deprecation warnings into errors.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import satmon
from satmon._compat import MODULES, MODULES_MOVED_IN_0_5, MOVED_IN_0_5, NAMES, SatmonDeprecationWarning


def _fresh(name: str) -> None:
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        if key in MODULES or key in MODULES_MOVED_IN_0_5:
            del sys.modules[key]


@pytest.mark.parametrize("old", sorted(k for k, v in MODULES.items() if v is not None))
def test_every_0_2_module_path_imports_with_a_warning_that_names_its_new_home(old):
    _fresh(old)
    new = MODULES[old]
    with pytest.warns(
        SatmonDeprecationWarning, match=rf"{old.replace('.', '[.]')} is deprecated.*use {new}.*until satmon 0\.5"
    ):
        alias = importlib.import_module(old)
    target = importlib.import_module(new)
    public = [n for n in getattr(target, "__all__", ()) if not n.startswith("_")]
    for name in public:  # every public name of the new home reads through the old path
        assert getattr(alias, name) is getattr(target, name)


@pytest.mark.parametrize(("old", "new"), sorted(NAMES.items()))
def test_names_that_moved_between_modules_warn_and_resolve(old, new):
    module, name = old
    _fresh(module)
    if module in MODULES or module in MODULES_MOVED_IN_0_5:  # an alias module: importing it warns too
        with pytest.warns(SatmonDeprecationWarning):
            mod = importlib.import_module(module)
    else:  # a 0.2 module that is a package now
        mod = importlib.import_module(module)
    with pytest.warns(SatmonDeprecationWarning, match=f"{module}.{name} is deprecated"):
        value = getattr(mod, name)
    assert value is getattr(importlib.import_module(new[0]), new[1])


def test_from_import_of_a_0_2_path_gets_the_new_object():
    _fresh("satmon.core")
    with pytest.warns(SatmonDeprecationWarning):
        from satmon.core.screen import Screen as Old
    from satmon import Screen

    assert Old is Screen


def test_the_warning_points_at_the_user_line_so_python_shows_it_by_default(tmp_path):
    script = tmp_path / "user.py"
    script.write_text("import satmon.callback\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert f"{script}:1: SatmonDeprecationWarning: satmon.callback is deprecated" in out.stderr


@pytest.mark.parametrize("gone", ["satmon.decide", "satmon.Report"])
def test_0_1_aliases_are_gone(gone):
    import satmon

    with pytest.raises(AttributeError, match=gone.split(".")[1]):
        getattr(satmon, gone.split(".")[1])


@pytest.mark.parametrize(
    "gone", ["satmon.models", "satmon.hooks", "satmon.gating", "satmon.functional.deadir", "satmon.data"]
)
def test_0_1_module_paths_are_gone(gone):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(gone)


@pytest.mark.parametrize("old", sorted(MODULES_MOVED_IN_0_5))
def test_every_0_4_replay_path_imports_with_a_warning_that_names_its_new_home(old):
    _fresh(old)
    new = MODULES_MOVED_IN_0_5[old]
    with pytest.warns(
        SatmonDeprecationWarning,
        match=rf"{old.replace('.', '[.]')} is deprecated since satmon 0\.5: "
        rf"use {new}.*until satmon 0\.6",
    ):
        alias = importlib.import_module(old)
    target = importlib.import_module(new)
    for name in [n for n in getattr(target, "__all__", ()) if not n.startswith("_")]:
        assert getattr(alias, name) is getattr(target, name)


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_IN_0_5.items()))
def test_the_replays_0_4_names_warn_and_resolve_to_one_meaning_each(old, new):
    module, name = old
    if module in MODULES_MOVED_IN_0_5:  # a moved module warns when imported; a name moved out of a module that stays
        _fresh(module)  # (satmon.build_verdict, satmon.io.tensorboard.TAG) warns when read
        with pytest.warns(SatmonDeprecationWarning):
            mod = importlib.import_module(module)
    else:
        mod = importlib.import_module(module)
    with pytest.warns(
        SatmonDeprecationWarning, match=f"{module}.{name} is deprecated since satmon 0.5: use {new[0]}.{new[1]}"
    ):
        value = getattr(mod, name)
    assert value is getattr(importlib.import_module(new[0]), new[1])


def test_satmon_replay_stays_the_function_after_the_old_package_path_is_imported():
    script = (
        "import inspect, warnings, satmon\n"
        "from satmon.replaying.session import replay\n"
        "assert satmon.replay is replay and inspect.isfunction(satmon.replay)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import satmon.replay.checkpoints  # the import system sets satmon.replay to the old package\n"
        "assert caught and 'satmon.replaying' in str(caught[0].message)\n"
        "try:\n"
        "    satmon.replay([])\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    # the call
    assert out.stdout.strip() == "ReplayUsageError Expected at least one checkpoint file or folder, got none."


def test_no_alias_names_a_path_that_exists_so_a_real_module_is_never_shadowed():
    root = Path(satmon.__file__).parent.parent
    for old in [*MODULES, *MODULES_MOVED_IN_0_5]:
        rel = root / old.replace(".", "/")
        assert not rel.with_suffix(".py").exists() and not (rel / "__init__.py").exists(), old


@pytest.mark.parametrize(("old", "new"), sorted(MODULES_MOVED_IN_0_5.items()))
def test_modules_renamed_in_0_5_import_with_a_warning_until_0_6(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(
        SatmonDeprecationWarning,
        match=rf"{old.replace('.', '[.]')} is deprecated since satmon 0[.]5: "
        rf"use "
        rf"{new.replace('.', '[.]')} .*until satmon 0[.]6",
    ):
        alias = importlib.import_module(old)
    target = importlib.import_module(new)
    assert all(getattr(alias, n) is getattr(target, n) for n in getattr(target, "__all__", ()))


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_IN_0_5.items()))
def test_names_moved_in_0_5_warn_and_resolve_until_0_6(old, new):
    module, name = old
    with pytest.warns(
        SatmonDeprecationWarning,
        match=rf"{module}[.]{name} is deprecated since satmon 0[.]5: use "
        rf"{new[0]}[.]{new[1]} .*until satmon 0[.]6",
    ):
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(importlib.import_module(new[0]), new[1])
    assert name not in getattr(importlib.import_module(module), "__all__", ())  # no longer listed where it was


def test_satmon_all_is_the_api_a_user_calls_and_each_name_reads_without_a_warning():
    import warnings

    mechanism = {"build_verdict", "LayerCounts", "Source", "GatingInfo", "SaturationCounter", "SaturationHooks"}
    assert not mechanism & set(satmon.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in satmon.__all__:
            getattr(satmon, name)
