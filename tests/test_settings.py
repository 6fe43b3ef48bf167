"""``satmon.Settings``: one frozen object, validated once, whose threshold comes from one place (the study, the
user or a calibration), and which reaches every consumer whole: ``Screen``, the live probe, ``probe()``, replay."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import satmon
from satmon import Settings, study
from satmon._compat import SatmonDeprecationWarning
from satmon.results.calibration import Calibration, CalibrationError, load_calibration
from satmon.settings import settings_from

PACKAGE = Path(satmon.__file__).resolve().parent


def _calibration_file(
    tmp_path: Path, threshold: float = 0.45, metric: str = "saturation", name: str = "cal.json"
) -> Path:
    """A calibration.json as ``satmon calibrate`` writes it (the fields load_calibration reads)."""
    path = tmp_path / name
    path.write_text(
        json.dumps(
            {
                "format": "satmon-calibration",
                "version": 1,
                "threshold": threshold,
                "rule": "midpoint",
                "metric": metric,
                "n": 6,
                "groups": 2,
                "accuracy": 1.0,
                "loso_accuracy": 0.5,
                "auc": 1.0,
                "provenance": {
                    "source": "my six runs",
                    "created": "2026-01-01T00:00:00+00:00",
                    "satmon_version": "0.3.0",
                },
            }
        )
    )
    return path


# ------------------------------------------------------------------------------------- defaults and resolution
def test_defaults_are_the_studys_numbers():
    s = Settings()
    assert (s.rule.threshold, s.level, s.collapse_threshold, s.rule.caveat) == (
        study.THRESHOLD,
        study.LEVEL,
        study.COLLAPSE_THRESHOLD,
        study.CAVEAT,
    )
    assert (s.threshold, s.caveat) == (None, None)  # kept as given: the rule holds the values in force
    assert s.calibration is None and s.product == "module" and s.window == 500


def test_the_studys_threshold_is_a_literal_only_in_satmon_study():
    """0.43 (and the fit's 0.43985) appear as numbers in satmon's code only in satmon/study.py."""
    pending: dict[str, str] = {}  # none left: the replay and the demo default to threshold=None (the study's rule)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "study.py" or rel in pending:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, float)
                and node.value in (study.THRESHOLD, study.FIT_THRESHOLD)
            ):
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"the study's threshold written as a literal (read satmon.study.THRESHOLD): {found}"


def test_threshold_none_means_the_studys_and_a_given_one_is_kept():
    assert Settings(threshold=None).rule.threshold == study.THRESHOLD
    mine = Settings(threshold=0.3)
    assert mine.threshold == 0.3 and mine.rule.threshold == 0.3 and mine.rule.caveat == study.CAVEAT
    given = Settings(threshold=study.THRESHOLD)  # the study's value given: kept as given, no longer "not set"
    assert given.threshold == study.THRESHOLD and given.rule.threshold_source == "user"
    assert Settings(threshold=0.3, caveat="Caveat: mine.").rule.caveat == "Caveat: mine."


@pytest.mark.parametrize("as_path", [str, Path, load_calibration], ids=["str", "Path", "Calibration"])
def test_calibration_gives_its_threshold_and_its_caveat(tmp_path, as_path):
    path = _calibration_file(tmp_path, threshold=0.45)
    s = Settings(calibration=as_path(path))
    assert isinstance(s.calibration, Calibration) and s.calibration.path == str(path)
    assert s.rule.threshold == 0.45 and s.threshold is None and s.rule.threshold_source == "calibration"
    # the card's line names the calibration's numbers, not the study's 12 cells
    caveat = s.rule.caveat
    assert caveat.startswith("Caveat: threshold 0.45") and "6 cells in 2 groups (my six runs)" in caveat
    assert "50% leave-one-group-out" in caveat and "12 cells" not in caveat


def test_threshold_and_calibration_together_are_refused(tmp_path):
    path = _calibration_file(tmp_path, threshold=0.45)
    with pytest.raises(
        ValueError, match=r"Expected either `threshold` or `calibration`, got both \(threshold=0.5, .*drop"
    ):
        Settings(threshold=0.5, calibration=path)
    with pytest.raises(ValueError, match=r"Expected either `threshold` or `calibration`.*threshold=0.43"):
        Settings(threshold=study.THRESHOLD, calibration=path)  # 0.2 read 0.43 as "not set" and dropped it silently
    with pytest.raises(ValueError, match=r"Expected either `caveat` or `calibration`"):
        Settings(caveat="Caveat: mine.", calibration=path)


def test_replace_keeps_a_calibrated_settings_calibrated(tmp_path):
    s = Settings(calibration=_calibration_file(tmp_path, threshold=0.45))
    t = dataclasses.replace(s, window=50)  # the threshold and caveat were kept as given (None): no clash
    assert (t.window, t.rule, t.calibration) == (50, s.rule, s.calibration)
    moved = dataclasses.replace(Settings(), calibration=s.calibration)  # the study's rule was not given: none to drop
    assert moved.rule == s.rule and moved.rule.threshold == 0.45
    with pytest.raises(ValueError, match="either `threshold` or `calibration`"):
        dataclasses.replace(Settings(threshold=0.3), calibration=s.calibration)  # a threshold given: say which to drop


def test_a_calibration_of_another_metric_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"Expected a calibration of the pooled saturation.*got metric 'first_block'"):
        Settings(calibration=_calibration_file(tmp_path, metric="first_block"))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (
            123,
            r"Expected a path to a calibration.json or a Calibration, got 123 \(int\) for `calibration`: pass the file",
        ),
        (b"cal.json", r"Expected a path to a calibration.json or a Calibration, got b'cal.json' \(bytes\)"),
        ({"threshold": 0.4}, r"Expected a path to a calibration.json or a Calibration, got <dict> \(dict\)"),
        (True, r"got True \(bool\)"),
    ],
)
def test_calibration_that_is_no_path_is_refused(value, match):
    with pytest.raises(CalibrationError, match=match):
        Settings(calibration=value)


def test_unreadable_calibrations_get_a_clear_message(tmp_path):
    binary = tmp_path / "weights.pt"
    binary.write_bytes(b"PK\x03\x04\x00\xff\xfe\x80 binary")
    with pytest.raises(
        CalibrationError, match=r"got a binary file \(byte 0xff at offset 5 is not UTF-8\).*calibration.json itself"
    ):
        Settings(calibration=binary)
    with pytest.raises(CalibrationError, match="got a folder at"):
        Settings(calibration=tmp_path)
    with pytest.raises(CalibrationError, match="got no file at"):
        Settings(calibration=tmp_path / "missing.json")
    with pytest.raises(CalibrationError, match="got (an unusable path|no file|a path the system cannot take)"):
        Settings(calibration="cal\x00.json")
    with pytest.raises(CalibrationError, match=r"got a name of 5,000 bytes, over .*NAME_MAX"):
        Settings(calibration="x" * 5000)
    with pytest.raises(
        CalibrationError, match="Expected a path to a calibration.json, got '': pass OUT/calibration.json"
    ):
        Settings(calibration="")  # not the working directory
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(65 * 2**20)  # sparse: no disk used
    with pytest.raises(CalibrationError, match="got a file of 65 MiB"):
        Settings(calibration=big)
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CalibrationError, match="(nesting too deep|Expected format)"):
        Settings(calibration=tmp_path / "deep.json")
    (tmp_path / "words.json").write_text(json.dumps({"format": "satmon-calibration", "threshold": 0.4, "n": "six"}))
    with pytest.raises(CalibrationError, match="Expected numbers for threshold, n, groups"):
        Settings(calibration=tmp_path / "words.json")
    bom = _calibration_file(tmp_path, name="bom.json")
    bom.write_bytes(b"\xef\xbb\xbf" + bom.read_bytes())  # a byte-order mark (Windows editors) is read
    assert Settings(calibration=bom).rule.threshold == 0.45


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_a_calibration_without_read_permission(tmp_path):
    path = _calibration_file(tmp_path)
    path.chmod(0)
    with pytest.raises(CalibrationError, match="Expected a readable calibration JSON.*permissions"):
        Settings(calibration=path)


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold": 1.5}, r"Expected `threshold` in \(0, 1\)"),
        ({"threshold": "0.4"}, r"Expected `threshold` in \(0, 1\)"),
        ({"level": -1.0}, "Expected `level` > 0"),
        ({"collapse_threshold": 0.0}, r"Expected `collapse_threshold` in \(0, 1\)"),
        ({"product": "rounded"}, "Expected `product`"),
        ({"caveat": 3}, "Expected `caveat` to be a str"),
        ({"window": 0}, "Expected `window` to be a positive int"),
        ({"sample_every": 9, "window": 8}, r"Expected `sample_every` to be an int in \[1, 8\]"),
        ({"offset_every": -1}, "Expected `offset_every`"),
        ({"include": 123}, "Expected `include` to be None, a regex"),
        ({"exclude": "(unclosed"}, "valid regular expression"),
        ({"gating_mapping": ["a"]}, r"Expected `gating_mapping` to be a dict .*got list"),
        (
            {"gating_mapping": {"blocks.0.norm": 1}},
            r"Expected `gating_mapping\['blocks.0.norm'\]` to be the name of the gated "
            r"MLP module it feeds \(str\) or None .*got 1 \(int\)",
        ),
        ({"gating_mapping": {"a": ["blocks.0.mlp"]}}, r"got <list> \(list\)"),
        (
            {"gating_mapping": {0: "blocks.0.mlp"}},
            r"Expected the keys of `gating_mapping` to be DyT layer names \(str\), got 0",
        ),
        ({"watch_every_n_steps": -1}, "Expected `watch_every_n_steps`"),
        ({"patience": 0}, "Expected `patience`"),
        ({"loss_spike_z": float("inf")}, "Expected `loss_spike_z` > 0"),
        ({"loss_baseline": 1}, "Expected `loss_baseline`"),
        ({"abort_on": "sometimes"}, "Expected `abort_on` in"),
        ({"abort_mode": "explode"}, "Expected `abort_mode` in"),
        ({"dry_run": 1}, "Expected `dry_run` to be True or False"),
    ],
)
def test_every_field_is_checked_when_made(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Settings(**kwargs)


def test_gating_mapping_takes_names_and_none_and_is_a_copy():
    given = {"blocks.0.norm_2": "blocks.0.mlp", "blocks.1.norm_2": None}
    s = Settings(gating_mapping=given)
    given["blocks.0.norm_2"] = "elsewhere"
    assert s.gating_mapping == {"blocks.0.norm_2": "blocks.0.mlp", "blocks.1.norm_2": None}


def test_frozen_keyword_only_and_comparable():
    s = Settings(window=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.window = 20
    with pytest.raises(TypeError):
        Settings(10)  # positional: which field would 10 be?
    assert s == Settings(window=10) and s != Settings(window=11)
    assert Settings.names()[:6] == ("threshold", "level", "collapse_threshold", "product", "caveat", "calibration")


def test_settings_from_one_source():
    s = Settings(window=7)
    assert settings_from(s, {}, owner="X") is s
    assert settings_from(None, {"window": 7}, owner="X") == s
    with pytest.raises(
        ValueError, match=r"Expected either `settings` or keyword options, got both \(options \['level'\]\)"
    ):
        settings_from(s, {"level": 3.0}, owner="X")
    with pytest.raises(TypeError, match=r"Expected X options among \[.*'window'.*\] \(plus a, b\), got \['windw'\]"):
        settings_from(None, {"windw": 7}, owner="X", own=("a", "b"))
    with pytest.raises(TypeError, match=r"Expected `settings` to be a satmon.Settings or None, got 500 \(int\)"):
        settings_from(500, {}, owner="X")


# -------------------------------------------------------------------- the consumers: one object, passed whole
def test_every_consumer_takes_settings_or_options_not_both():
    from satmon import SaturationMonitor, Screen, probe
    from satmon.drivers.live_probe import LiveProbe

    s = Settings(window=3)
    model = nn.Sequential(nn.Linear(4, 4), satmon.DyT(4))
    x = torch.randn(2, 4)
    for make in (
        lambda **kw: SaturationMonitor(**kw),
        lambda **kw: Screen(**kw),
        lambda **kw: LiveProbe(every_n_steps=1, **kw),
        lambda **kw: probe(model, x, **kw),
    ):
        with pytest.raises(ValueError, match="Expected either `settings` or keyword options, got both"):
            make(settings=s, level=3.0)
        with pytest.raises(TypeError, match=r"options among .*got \['levl'\]|arguments among .*got \['levl'\]"):
            make(levl=3.0)
    with pytest.raises(
        TypeError,
        match=r"Expected `settings` to be a satmon.Settings or None, got 500 \(int\): pass the "
        r"options by keyword \(SaturationMonitor\(window=500",
    ):
        SaturationMonitor(500)  # 0.2's first positional argument was the window


def test_the_same_settings_object_reaches_screen_live_probe_probe_and_replay(tmp_path, monkeypatch):
    """One Settings, built once: the monitor's Screen and LiveProbe hold it, the live probe hands it to probe(), and
    replay hands it to probe() for every checkpoint; the verdicts read its threshold and caveat."""
    import satmon.drivers.live_probe as live_module
    from helpers import tiny_lit, token_loader, trainer
    from satmon import SaturationMonitor, Screen
    from satmon.probing import passes
    from satmon.replaying.checkpoints import inspect_checkpoint
    from satmon.replaying.loop import ModelLoader, checkpoint_records

    s = Settings(window=2, calibration=_calibration_file(tmp_path, threshold=0.45), watch_every_n_steps=0)
    received = []
    real_probe = passes.probe

    def spy(*args, **kwargs):
        received.append(kwargs.get("settings"))
        return real_probe(*args, **kwargs)

    monkeypatch.setattr(live_module, "probe", spy)
    monitor = SaturationMonitor(settings=s, probe_every_n_steps=1, calibration_batches=1, verbose=False)
    assert monitor.settings is s and monitor.screen.settings is s and monitor.live_probe.settings is s
    assert Screen(s).settings is s
    trainer(tmp_path, max_steps=2, callbacks=[monitor]).fit(tiny_lit(alpha_init=20.0), token_loader(2))
    assert len(received) == 3 and all(r is s for r in received)  # steps 0, 1, 2
    for _, report in monitor.live_probe.reports:
        assert report.verdict.rule == s.rule and report.verdict.threshold == 0.45
    assert monitor.verdict.rule == s.rule and monitor.verdict.threshold == 0.45  # the window's verdict too

    received.clear()
    monkeypatch.setattr(passes, "probe", spy)  # replay imports probe from satmon.probing.passes when it runs
    net = lambda: nn.Sequential(nn.Linear(4, 4), satmon.DyT(4, alpha_init=20.0))
    files = []
    for i in range(2):
        files.append(str(tmp_path / f"w{i}.pt"))
        torch.save({"model": net().state_dict(), "iter_num": i}, files[-1])
    records = list(
        checkpoint_records(
            [inspect_checkpoint(f) for f in files],
            ModelLoader(factory=net),
            [torch.randn(8, 4)],
            settings=s,
            twin=False,
        )
    )
    assert [r.error for r in records] == [None, None]
    assert len(received) == 2 and all(r is s for r in received)
    assert all(
        r.verdict.threshold == 0.45 and r.verdict.rule == s.rule and r.verdict.source == "replay" for r in records
    )


def test_replay_builds_one_settings_from_probe_kwargs_and_refuses_both(tmp_path):
    from satmon.replaying.checkpoints import inspect_checkpoint
    from satmon.replaying.loop import ModelLoader, checkpoint_records

    net = lambda: nn.Sequential(nn.Linear(4, 4), satmon.DyT(4, alpha_init=20.0))
    f = str(tmp_path / "w.pt")
    torch.save({"model": net().state_dict(), "iter_num": 3}, f)
    (record,) = checkpoint_records(
        [inspect_checkpoint(f)],
        ModelLoader(factory=net),
        [torch.randn(8, 4)],
        probe_kwargs={"threshold": 0.3},
        twin=False,
    )
    assert record.error is None and record.verdict.threshold == 0.3
    with pytest.raises(ValueError, match="got both"):  # before any checkpoint is read
        next(
            checkpoint_records(
                [inspect_checkpoint(f)],
                ModelLoader(factory=net),
                [torch.randn(8, 4)],
                settings=Settings(),
                probe_kwargs={"threshold": 0.3},
            )
        )


def test_probe_reads_the_rule_and_selection_from_settings():
    from reference import reference
    from satmon import probe

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 4), satmon.DyT(4, alpha_init=3.0), nn.Linear(4, 4), satmon.DyT(4, alpha_init=3.0)
    )
    x = torch.randn(64, 4)
    with torch.no_grad():
        h1 = model[0](x)
        h2 = model[2](model[1](h1))
    counts = [reference(h, model[i].alpha, level=1.5) for h, i in ((h1, 1), (h2, 3))]  # float64 re-counts at level 1.5
    s = Settings(level=1.5, threshold=0.2, exclude=r"^3$")
    report = probe(model, x, settings=s)
    assert report.verdict.level == 1.5 and report.verdict.threshold == 0.2 and list(report.verdict.per_layer) == ["1"]
    assert report.verdict.saturation == counts[0] / h1.numel()
    both = probe(model, x, level=1.5)  # the same fields as keyword options
    assert both.verdict.saturation == sum(counts) / (h1.numel() + h2.numel())


def test_hf_callback_takes_settings_whole():
    pytest.importorskip("transformers")
    from satmon.drivers.hf import SatmonTrainerCallback

    s = Settings(window=9, abort_on="no-go")
    cb = SatmonTrainerCallback(settings=s)
    assert cb.settings is s and cb.settings.window == 9
    with pytest.warns(
        SatmonDeprecationWarning, match=r"SatmonTrainerCallback.abort_on is deprecated.*settings.abort_on"
    ):
        assert cb.abort_on == "no-go"  # satmon 0.4's forwarding: one release more
    with pytest.raises(ValueError, match="got both"):
        SatmonTrainerCallback(settings=s, window=3)
    with pytest.raises(
        TypeError, match=r"Expected SatmonTrainerCallback options among .*\(plus logdir, .*got \['windo'\]"
    ):
        SatmonTrainerCallback(windo=3)
    with pytest.raises(TypeError, match="Expected `settings` to be a satmon.Settings"):
        SatmonTrainerCallback(500)  # 0.2's first positional argument was the window
    with pytest.raises(ValueError, match=r"Expected `logdir` to be a folder path or None, got 3 \(int\)"):
        SatmonTrainerCallback(logdir=3)


def test_an_option_read_on_its_holder_is_deprecated_and_reads_what_0_4_read(tmp_path):
    """``monitor.window`` (satmon 0.4's forwarding) warns and names the plain attribute; ``monitor.threshold`` and
    ``monitor.caveat`` read the value in force, as 0.4 did, now ``monitor.settings.rule``'s."""
    from satmon.settings import ReadsSettings

    class Holder(ReadsSettings):
        def __init__(self, settings: Settings) -> None:
            self.settings = settings

    calibrated = Holder(Settings(calibration=_calibration_file(tmp_path, threshold=0.45)))
    with pytest.warns(
        SatmonDeprecationWarning, match=r"Holder.threshold is deprecated.*use Holder.settings.rule.threshold"
    ):
        assert calibrated.threshold == 0.45 and calibrated.settings.threshold is None
    with pytest.warns(SatmonDeprecationWarning, match=r"Holder.caveat is deprecated.*use Holder.settings.rule.caveat"):
        assert calibrated.caveat == calibrated.settings.rule.caveat
    with pytest.warns(SatmonDeprecationWarning, match=r"Holder.window is deprecated.*use Holder.settings.window \("):
        assert Holder(Settings(window=7)).window == 7
    with pytest.raises(AttributeError, match="has no attribute 'windw'"):
        _ = Holder(Settings()).windw
