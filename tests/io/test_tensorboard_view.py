"""What TensorBoard shows of a satmon run: the Scalars groups and their order, the Text tab's tag, the HParams columns.

References, independent of satmon:

- the group order: TensorBoard groups a run's tags by the prefix before the first ``/`` and orders them with its
  ``compareTagNames``; the two ports below are TensorBoard 2.21's two versions of it (the Scalars tab's, where
  ``/``, ``_`` and digits are break characters, and the Time Series tab's, where ``/`` and digits are), checked
  first against the order both tabs showed in Chromium for a run of probe tags (``OBSERVED``);
- the Text tab's tags: TensorBoard's ``EventMultiplexer``, by plugin;
- the HParams columns: TensorBoard's own hparams backend (conftest ``tb.hparams_view``).
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.tensorboard import SummaryWriter

from helpers import tiny_lit, token_loader, trainer
from satmon import SaturationMonitor
from satmon.io.lightning import LightningSink
from satmon.io.tags import TAG
from satmon.io.tensorboard import SummaryWriterSink, log_stop, log_verdict
from satmon.io.tensorboard_reader import read_run
from satmon.results.stop import StopReason, StopRecord
from satmon.results.verdict import build_verdict


# ------------------------------------------------------------------ TensorBoard's tag order
def _digits_end(s: str, i: int) -> int:
    while i < len(s) and s[i].isdigit():
        i += 1
    return i


def _compare(a: str, b: str, breaks: str) -> int:
    """TensorBoard's ``compareTagNames``: digit runs compare as numbers, a break character sorts before any
    other, other characters by code point, a string that ends first sorts first (integers only: no tag here
    holds a decimal point between digits)."""
    i = j = 0
    while True:
        if i == len(a):
            return 0 if j == len(b) else -1
        if j == len(b):
            return 1
        if a[i].isdigit() and b[j].isdigit():
            i2, j2 = _digits_end(a, i), _digits_end(b, j)
            x, y = int(a[i:i2]), int(b[j:j2])
            if x != y:
                return -1 if x < y else 1
            i, j = i2, j2
            continue
        ab, bb = a[i] in breaks or a[i].isdigit(), b[j] in breaks or b[j].isdigit()
        if ab and not bb:
            return -1
        if bb and not ab:
            return 1
        if not ab and a[i] != b[j]:
            return -1 if a[i] < b[j] else 1
        i, j = i + 1, j + 1


TABS = {"scalars": "/_", "time series": "/"}


def groups(tags: list[str], tab: str) -> list[tuple[str, list[str]]]:
    """The tab's groups in order: tags sorted by the tab's ``compareTagNames``, grouped by their first ``/``."""
    out: dict[str, list[str]] = {}
    for tag in sorted(tags, key=functools.cmp_to_key(lambda a, b: _compare(a, b, TABS[tab]))):
        out.setdefault(tag.split("/", 1)[0], []).append(tag)
    return list(out.items())


PROBE_TAGS = [
    "epoch",
    "train/loss",
    "val/loss",
    "lr-AdamW",
    "satmon/saturation",
    "satmon/verdict",
    "satmon/margin",
    "satmon_alpha/ln_f",
    "satmon-layer/ln_f",
    "satmon.layers/ln_f",
    "Satmon/cap",
    "_satmon/under",
    "0satmon/digit",
    "dyt/x",
    "satmon saturation/sp",
    "hp_metric",
]
#: The group order TensorBoard 2.21 showed for PROBE_TAGS (one scalar each), read off Chromium screenshots.
OBSERVED = {
    "scalars": [
        "0satmon",
        "_satmon",
        "Satmon",
        "dyt",
        "epoch",
        "hp_metric",
        "lr-AdamW",
        "satmon_alpha",
        "satmon",
        "satmon saturation",
        "satmon-layer",
        "satmon.layers",
        "train",
        "val",
    ],
    "time series": [
        "0satmon",
        "Satmon",
        "_satmon",
        "dyt",
        "epoch",
        "hp_metric",
        "lr-AdamW",
        "satmon",
        "satmon saturation",
        "satmon-layer",
        "satmon.layers",
        "satmon_alpha",
        "train",
        "val",
    ],
}


@pytest.mark.parametrize("tab", list(TABS))
def test_the_ports_order_groups_as_tensorboard_showed_them(tab):
    assert [name for name, _ in groups(PROBE_TAGS, tab)] == OBSERVED[tab]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A Lightning run with satmon, a TensorBoardLogger and the model's own ``self.log`` (so
    Lightning writes ``epoch``)."""
    root = tmp_path_factory.mktemp("live")
    torch.manual_seed(0)
    monitor = SaturationMonitor(window=4, log_every_n_steps=2, verbose=False)
    logger = TensorBoardLogger(str(root), name="run", version=0, default_hp_metric=False)
    trainer(root, max_steps=5, callbacks=[monitor], logger=logger, log_every_n_steps=2).fit(tiny_lit(), token_loader(5))
    return root, Path(logger.log_dir), monitor


@pytest.mark.parametrize("tab", list(TABS))
def test_the_first_scalars_group_holds_the_verdict(live, tab, tb):
    _, log_dir, monitor = live
    tags = tb.scalar_tags(tb.accumulate(log_dir))
    assert {"epoch", "train/loss"} <= set(tags)  # Lightning's and the model's own, which sorted first in 0.2
    shown = groups(tags, tab)
    first, members = shown[0]
    assert first == TAG.summary
    assert (
        {TAG.saturation, TAG.verdict, TAG.margin, TAG.nonfinite}
        <= set(members)
        <= {TAG.saturation, TAG.verdict, TAG.margin, TAG.nonfinite, TAG.stop, TAG.forecast}
    )
    assert members[0] == TAG.verdict == "Satmon/decision"  # the first chart of the first group is the decision
    # each per-layer family in a group of its own, holding every layer and nothing else
    by_name = dict(shown)
    for family, tag_of in (("satmon_saturation", TAG.layer_saturation), ("satmon_alpha", TAG.alpha)):
        assert sorted(by_name[family]) == sorted(tag_of(n) for n in monitor.layer_names)
    assert all(name in (TAG.summary, *TAG.families) for name, _ in shown if TAG.is_satmon(by_name[name][0]))


@pytest.mark.parametrize("sink_kind", ["summary_writer", "lightning"])
def test_texts_show_under_their_own_tag(sink_kind, tmp_path, tb):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    verdict = build_verdict({"ln_f": (3, 4)}, step=4, window=4)
    if sink_kind == "summary_writer":
        sink, finish = SummaryWriterSink(tmp_path / "run"), None
    else:
        logger = TensorBoardLogger(str(tmp_path), name="run", version="", default_hp_metric=False)
        sink, finish = LightningSink([logger]), logger
    log_verdict(sink, verdict)
    log_stop(sink, StopRecord(StopReason.NONFINITE, "NaN", 4))
    sink.close()
    if finish is not None:
        finish.finalize("success")
    mux = EventMultiplexer().AddRunsFromDirectory(str(tmp_path))
    mux.Reload()
    assert mux.PluginRunToTagToContent("text") == {"run": {TAG.verdict_text: b"", TAG.stop_text: b""}}
    assert tb.text(tb.accumulate(tmp_path / "run"), TAG.verdict_text) == [(4, verdict.card())]


# ------------------------------------------------------------------------------ HParams
def _hparams_run(root: Path, default_hp_metric: bool) -> None:
    torch.manual_seed(0)
    logger = TensorBoardLogger(str(root), name="run", version=0, default_hp_metric=default_hp_metric)
    monitor = SaturationMonitor(window=3, verbose=False)
    trainer(root, max_steps=3, callbacks=[monitor], logger=logger).fit(tiny_lit(), token_loader(3))


def test_the_hparams_tab_opens_with_the_decision_beside_the_models_hyperparameters(tmp_path, tb):
    """The session holds LitLM's nine hyper-parameters, all sorting before ``satmon/...`` by name."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        _hparams_run(tmp_path, default_hp_metric=False)
    assert not [w for w in said if "satmon:" in str(w.message)]  # default_hp_metric=False: nothing to say
    view = tb.hparams_view(tmp_path)
    assert {"alpha_init", "arch", "lr", "warmup"} <= set(view["hparams"])
    assert view["shown"][0] == TAG.hp_decision and TAG.hp_source in view["hparams"]
    [session] = tb.hparams_sessions(tmp_path)
    if TAG.hp_trust in session["hparams"]:
        assert view["shown"][:2] == [TAG.hp_decision, TAG.hp_trust]
    assert view["metrics"][:3] == [TAG.verdict, TAG.margin, TAG.saturation]


def test_lightnings_default_hp_metric_session_is_said(tmp_path, tb):
    """TensorBoard takes the columns from the run's own (Lightning's) session: satmon says so and what to pass."""
    with pytest.warns(
        UserWarning, match=r"default_hp_metric=True.*TensorBoardLogger\(\.\.\., default_hp_metric=False\)"
    ):
        _hparams_run(tmp_path, default_hp_metric=True)
    view = tb.hparams_view(tmp_path)
    assert TAG.hp_decision not in view["hparams"] and view["metrics"] == ["hp_metric"]  # what the warning says


# --------------------------------------------------------------------------- 0.2 runs
def _write_v02(log_dir: Path, card: str) -> None:
    """What satmon 0.2 wrote for a run (its tags, through ``add_scalar`` and ``add_text``)."""
    with SummaryWriter(str(log_dir)) as w:
        for step, pooled in ((2, 0.25), (4, 0.5)):
            w.add_scalar("satmon/saturation", pooled, step)
            w.add_scalar("satmon/saturation/ln_f", pooled, step)
            w.add_scalar("satmon/alpha/ln_f", 2.0, step)
            w.add_scalar("satmon/nonfinite", 0.0, step)
        w.add_scalar("satmon/verdict", 1.0, 4)
        w.add_scalar("satmon/margin", 0.07, 4)
        w.add_scalar("satmon/collapse/risk", 0.0, 4)
        w.add_scalar("satmon/collapse/loss_z", 1.5, 6)
        w.add_scalar("satmon/deadir/h.0.ln/alignment", 0.5, 4)
        w.add_text("satmon/verdict", card, 4)


def test_a_0_2_run_reads_like_a_0_4_run(tmp_path):
    verdict = build_verdict({"ln_f": (2, 4)}, step=4, window=4)
    _write_v02(tmp_path / "old", verdict.card())
    new = SummaryWriterSink(tmp_path / "new")
    for step, pooled in ((2, 0.25), (4, 0.5)):
        new.scalars(
            {TAG.saturation: pooled, TAG.layer_saturation("ln_f"): pooled, TAG.alpha("ln_f"): 2.0, TAG.nonfinite: 0.0},
            step,
        )
    log_verdict(new, verdict)
    new.scalars({TAG.collapse_loss_z: 1.5}, 6)
    new.scalars({TAG.deadir_alignment("h.0.ln"): 0.5}, 4)
    new.close()
    old, ours = read_run(tmp_path / "old"), read_run(tmp_path / "new")
    assert old.scalars[TAG.verdict] == [(4, 1.0)] and old.decision() == ours.decision() == "go"
    assert (
        old.scalars[TAG.layer_saturation("ln_f")] == ours.scalars[TAG.layer_saturation("ln_f")] == [(2, 0.25), (4, 0.5)]
    )
    assert old.scalars[TAG.collapse_risk] == [(4, 0.0)] and old.scalars[TAG.collapse_loss_z] == [(6, 1.5)]
    assert old.layers() == ours.layers() == {"ln_f": {"saturation": 0.5, "alpha": 2.0}, "h.0.ln": {"alignment": 0.5}}
    assert old.last_text(TAG.verdict_text) == ours.last_text(TAG.verdict_text) == verdict.card()
    assert old.verdict_saturation() == ours.verdict_saturation() == 0.5
    assert set(old.scalars) - {TAG.collapse_risk} == set(ours.scalars)  # a non-gated verdict writes no risk
