"""Every Lightning logger gets the decision: CSV, TensorBoard, MLflow (its file store) and W&B (offline), all four in
one Trainer, each read back with its own tools for the decision word, the trust and the card; the console line names
where the card went; a sink of the user's is written beside the loggers, not replaced.

MLflow (``mlflow-skinny``, a local file store) and W&B (offline, its folder in the test's temporary folder) are in
the ``test`` extra and run here for real: never skipped, never a network call.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
from pathlib import Path

import pytest
import torch
import wandb
import yaml
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from helpers import assert_mentions, tiny_lit, token_loader, trainer
from satmon import SaturationMonitor
from satmon.io.sink import NullSink
from trackers import finished_run, own_trackers

WINDOW = 4


class Keep(NullSink):
    """A sink of the user's: keeps what it is given."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str, int]] = []
        self.closed = False

    def text(self, tag, markdown, step):
        self.texts.append((tag, markdown, step))
        return ["my sink"]

    def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One fit, window 4, with the four loggers (W&B offline, MLflow on a file store, both in this
    folder) and a sink of the user's."""
    root = tmp_path_factory.mktemp("loggers")
    with own_trackers(root):
        loggers = {
            "tb": TensorBoardLogger(str(root), name="tb", version=0, default_hp_metric=False),
            "csv": CSVLogger(str(root), name="csv", version=0),
            "mlflow": MLFlowLogger(experiment_name="satmon", tracking_uri=f"file:{root / 'mlruns'}"),
            "wandb": WandbLogger(project="satmon", save_dir=str(root / "wandb"), offline=True),
        }
        torch.manual_seed(0)
        mine = Keep()
        monitor = SaturationMonitor(window=WINDOW, sink=mine)  # verbose=False: the default
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            trainer(root, max_steps=WINDOW + 1, callbacks=[monitor], logger=list(loggers.values())).fit(
                tiny_lit(), token_loader(WINDOW + 1)
            )
        wandb.finish()
    return monitor, loggers, mine, out.getvalue(), root


def _card_checks(text: str, monitor) -> None:
    v = monitor.verdict
    assert text.strip() == v.card()
    word = {"go": "**GO**", "no-go": "**NO-GO**"}[v.decision]
    assert text.startswith(f"### satmon verdict: {word}") and f"Trust: **{v.trust}**" in text


def test_the_console_gets_one_line_naming_every_place(fitted):
    monitor, loggers, _, out, root = fitted
    v = monitor.verdict
    [line] = [l for l in out.splitlines() if l.startswith("satmon verdict:")]
    assert out.count("satmon verdict") == 1 and "| layer |" not in out  # one line, not the card
    assert line.startswith(f"satmon verdict: {v.decision.upper()}")  # the decision first
    assert_mentions(
        line.split("; card: ")[0], f"trust: {v.trust}", f"{v.saturation:.4f} {'>=' if v.go else '<'} threshold 0.43"
    )
    places = line.split("; card: ")[1].split(", ")
    assert (
        f"TensorBoard {loggers['tb'].log_dir}" in places
        and str(Path(loggers["csv"].log_dir) / "satmon_verdict.md") in places
    )
    assert "my sink" in places
    assert f"MLflow run {loggers['mlflow'].run_id} (artifact satmon_verdict.md)" in places
    assert f"W&B run {loggers['wandb'].version} (table satmon/verdict)" in places


def test_a_users_sink_is_written_beside_the_loggers_and_left_open(fitted):
    monitor, _, mine, _, _ = fitted
    assert [(t, s) for t, _, s in mine.texts] == [("satmon/verdict", WINDOW)] and mine.texts[0][
        1
    ] == monitor.verdict.card()
    assert not mine.closed  # the user's to close


def test_csv_logger_gets_the_decision_trust_and_card(fitted):
    monitor, loggers, _, _, _ = fitted
    v, log_dir = monitor.verdict, Path(loggers["csv"].log_dir)
    rows = list(csv.DictReader((log_dir / "metrics.csv").open()))
    decided = [r for r in rows if r.get("Satmon/decision")]
    assert [(int(r["step"]), float(r["Satmon/decision"])) for r in decided] == [(WINDOW, 1.0 if v.go else 0.0)]
    saved = yaml.safe_load((log_dir / "hparams.yaml").read_text())
    assert (saved["satmon/decision"], saved["satmon/trust"]) == (v.decision, v.trust)
    _card_checks((log_dir / "satmon_verdict.md").read_text(), monitor)


def test_tensorboard_logger_gets_the_decision_trust_and_card(fitted, tb):
    monitor, loggers, _, _, root = fitted
    v = monitor.verdict
    ea = tb.accumulate(loggers["tb"].log_dir)
    assert tb.scalars(ea, "Satmon/decision") == [(WINDOW, 1.0 if v.go else 0.0)]
    assert f"trust: {v.trust}" in ea.SummaryMetadata("Satmon/decision").summary_description
    [(step, card)] = tb.text(ea, "satmon/verdict")
    assert step == WINDOW
    _card_checks(card, monitor)
    [session] = tb.hparams_sessions(root / "tb")
    assert session["hparams"]["satmon/decision"] == ("string_value", v.decision)
    assert session["hparams"]["satmon/trust"] == ("string_value", v.trust)
    assert "lr" in session["hparams"]  # the model's own hyper-parameters beside satmon's


def test_mlflow_logger_gets_the_decision_trust_and_card(fitted, tmp_path):
    from mlflow.tracking import MlflowClient

    monitor, loggers, _, _, root = fitted
    v, run_id = monitor.verdict, loggers["mlflow"].run_id
    client = MlflowClient(f"file:{root / 'mlruns'}")
    data = client.get_run(run_id).data
    assert (data.params["satmon/decision"], data.params["satmon/trust"]) == (v.decision, v.trust)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "Satmon/decision")] == [
        (WINDOW, 1.0 if v.go else 0.0)
    ]
    _card_checks(Path(client.download_artifacts(run_id, "satmon_verdict.md", str(tmp_path))).read_text(), monitor)


def test_wandb_logger_gets_the_decision_trust_and_card(fitted):
    monitor, loggers, _, _, root = fitted
    v = monitor.verdict
    [run_file] = glob.glob(str(root / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    config, history = finished_run(run_file)
    assert (config["satmon/decision"], config["satmon/trust"]) == (v.decision, v.trust)
    assert [(h["trainer/global_step"], h["Satmon/decision"]) for h in history if "Satmon/decision" in h] == [
        (WINDOW, 1.0 if v.go else 0.0)
    ]
    [table] = glob.glob(str(Path(run_file).parent / "files" / "media" / "table" / "satmon" / "verdict_*.table.json"))
    data = json.loads(Path(table).read_text())
    assert data["columns"] == ["markdown"]
    _card_checks(data["data"][0][0], monitor)
