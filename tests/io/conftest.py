"""The writer tests' reference reader: TensorBoard's own classes, independent of satmon's reader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
event_multiplexer = pytest.importorskip("tensorboard.backend.event_processing.event_multiplexer")
plugin_data_pb2 = pytest.importorskip("tensorboard.plugins.hparams.plugin_data_pb2")

#: 0 = keep every event of every kind
GUIDANCE = {k: 0 for k in ("compressedHistograms", "images", "audio", "scalars", "histograms", "tensors")}


def accumulate(path: str | Path) -> event_accumulator.EventAccumulator:
    return event_accumulator.EventAccumulator(str(path), size_guidance=GUIDANCE).Reload()


def scalars(ea: event_accumulator.EventAccumulator, tag: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` in write order, as TensorBoard stored them (float32)."""
    return [(e.step, e.value) for e in ea.Scalars(tag)]


def text(ea: event_accumulator.EventAccumulator, tag: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in ea.Tensors(f"{tag}/text_summary")]


def hparams_sessions(log_root: str | Path) -> list[dict]:
    """Every hparams session TensorBoard shows under ``log_root``: its run, its hyper-parameters as
    ``{key: (kind, value)}`` (``kind``: the protobuf field set, ``string_value`` or ``number_value``),
    its metric tags and the discrete domains it declares."""
    mux = event_multiplexer.EventMultiplexer(size_guidance=GUIDANCE).AddRunsFromDirectory(str(log_root))
    mux.Reload()
    out = []
    for run, tags in mux.PluginRunToTagToContent("hparams").items():
        start = plugin_data_pb2.HParamsPluginData.FromString(tags["_hparams_/session_start_info"]).session_start_info
        exp = plugin_data_pb2.HParamsPluginData.FromString(tags["_hparams_/experiment"]).experiment
        hp = {k: (v.WhichOneof("kind"), getattr(v, v.WhichOneof("kind"))) for k, v in start.hparams.items()}
        domains = {h.name: [getattr(v, v.WhichOneof("kind")) for v in h.domain_discrete.values]
                   for h in exp.hparam_infos if h.HasField("domain_discrete")}
        out.append({"run": run, "hparams": hp, "metrics": [m.name.tag for m in exp.metric_infos], "domains": domains})
    return out


@pytest.fixture(scope="session")
def tb() -> SimpleNamespace:
    """The reference reader's functions (``tb.accumulate``, ``tb.scalars``, ``tb.text``, ``tb.hparams_sessions``)."""
    return SimpleNamespace(accumulate=accumulate, scalars=scalars, text=text, hparams_sessions=hparams_sessions)
