"""Every command satmon prints for the user is shell-quoted: pasted into a shell, each path stays one argument
(issue 44.2: the replay's ``satmon report .../replay of demo/version_0`` split in two)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from satmon.cli.main import command

AWKWARD = [
    "satmon_logs/replay of demo/version_0",
    "it's",
    'a "b"',
    "$HOME;rm -rf x",
    "tab\there",
    "-dash",
    "*.ckpt",
    "",
]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to paste into")
@pytest.mark.parametrize("word", AWKWARD)
def test_a_printed_command_pasted_into_bash_gives_each_word_back(word):
    printed = command("printf", "%s\\0", word, "--next")
    out = subprocess.run(["bash", "-c", printed], capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [word.encode(), b"--next"]


def test_every_printed_command_goes_through_command():
    """The CLI's printed commands (replay's report line, the demo's three, calibrate's
    record) are built by command()."""
    import inspect

    from satmon.cli import calibrate, demo, replay

    for module, n in ((replay, 1), (demo, 3), (calibrate, 1)):
        source = inspect.getsource(module)
        assert source.count("command(") + source.count("pasteable(") >= n, module.__name__
        assert "satmon report {" not in source and "satmon replay {" not in source and "--logdir {" not in source


@pytest.mark.parametrize("command_name", ["replay", "calibrate", "report", "demo"])
def test_a_bad_setting_in_the_environment_is_one_line_and_exit_2_before_any_work(
    command_name, monkeypatch, capsys, tmp_path
):
    """issue 44.4: SATMON_MAX_PICKLE_MB=abc was found at every checkpoint ("skipped ... ValueError", exit 1)."""
    from satmon.cli.main import main

    monkeypatch.setenv("SATMON_MAX_PICKLE_MB", "abc")
    assert main([command_name, str(tmp_path / "nothing.ckpt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SATMON_MAX_PICKLE_MB" in err[0] and "'abc'" in err[0], err
