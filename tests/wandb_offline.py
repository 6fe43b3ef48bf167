"""Read an offline W&B run back without W&B's service: its run file's records (the config and the history)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        pieces += raw[pos + 7:pos + 7 + length]
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
