"""The real trackers in the tests: a test's own W&B (offline) and MLflow (a local file store), free of what an
earlier test left in either's process-wide state, and an offline W&B run read back without W&B's service (its run
file's records: the config and the history)."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def own_trackers(folder: str | os.PathLike) -> Iterator[Path]:
    """W&B offline with its folder ``folder`` and MLflow's tracking URI the file store ``folder/mlruns``, for the
    block. Both trackers keep process-wide state that an environment variable set later does not reach: MLflow
    its tracking URI once set (Lightning's ``MLFlowLogger`` sets it; Hugging Face's ``MLflowCallback`` then keeps
    it), W&B its settings and service from its first ``init``. So W&B is torn down (its service stopped, its
    settings dropped) before and after the block, MLflow's URI set for the block and set back after it."""
    import mlflow
    import wandb

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(folder),
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "MLFLOW_TRACKING_URI": f"file:{folder / 'mlruns'}",
    }
    saved = {k: os.environ.get(k) for k in env}
    before = mlflow.get_tracking_uri()
    wandb.teardown()
    os.environ.update(env)
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    try:
        yield folder
    finally:
        if wandb.run is not None:
            wandb.finish()
        wandb.teardown()
        if mlflow.active_run() is not None:
            mlflow.end_run()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        mlflow.set_tracking_uri(before)


def wandb_records(run_file: str) -> Iterator[Any]:
    """The records of an offline W&B run file (W&B's LevelDB-style log: a 7-byte header, then 32 KiB blocks of
    records, each ``crc32 (4) | length (2) | type (1)``; type 1 whole, 2-4 first, middle, last piece)."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = Path(run_file).read_bytes()
    assert raw[:4] == b":W&B"
    pos, block, pieces = 7, 32768, b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header: padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0 and length == 0 or pos + 7 + length > len(raw):  # the end, or a record still being written
            break
        pieces += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pieces)
            yield record
            pieces = b""


def wandb_config_and_history(run_file: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's config (key -> value) and its history rows (key -> value), as the run logged them."""
    config: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return config, history


def finished_run(
    run_file: str, keys: tuple[str, ...] = ("satmon/decision", "satmon/trust"), timeout: float = 60.0
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """:func:`wandb_config_and_history` once the run's config holds ``keys``: W&B's service writes the run file
    from a process of its own, and on a loaded machine its last records can land after ``wandb.finish()`` has
    returned. Re-read until they are there, for ``timeout`` seconds at most; then fail naming what the file held."""
    deadline = time.monotonic() + timeout
    while True:
        config, history = wandb_config_and_history(run_file)
        if all(k in config for k in keys) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kinds = sorted({r.WhichOneof("record_type") for r in wandb_records(run_file)})
    assert all(k in config for k in keys), (
        f"Expected {keys} in the config of the offline W&B run {run_file} within "
        f"{timeout:.0f} s, got config keys {sorted(config)} (records: {kinds})"
    )
    return config, history
