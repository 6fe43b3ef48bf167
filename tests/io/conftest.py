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
    """``[(step, value)]`` in write order, as TensorBoard stored them (float32): an ``add_scalar`` series, or one in
    the scalar plugin's tensor form (a described tag)."""
    if tag in ea.Tags()["scalars"]:
        return [(e.step, e.value) for e in ea.Scalars(tag)]
    from tensorboard.util import tensor_util

    assert ea.SummaryMetadata(tag).plugin_data.plugin_name == "scalars", f"{tag} holds no scalar"
    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto).astype("float32"))) for e in ea.Tensors(tag)]


def scalar_tags(ea: event_accumulator.EventAccumulator) -> list[str]:
    """Every scalar tag, in either form (TensorBoard's Scalars tab shows both)."""
    tensors = [t for t in ea.Tags()["tensors"] if ea.SummaryMetadata(t).plugin_data.plugin_name == "scalars"]
    return [*ea.Tags()["scalars"], *tensors]


def text(ea: event_accumulator.EventAccumulator, tag: str) -> list[tuple[int, str]]:
    """The texts under ``tag`` as TensorBoard's Text tab names it (the tag itself, text plugin's data)."""
    assert ea.SummaryMetadata(tag).plugin_data.plugin_name == "text", f"{tag} holds no text"
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in ea.Tensors(tag)]


def hparams_view(log_root: str | Path) -> dict:
    """What TensorBoard's HParams tab shows for ``log_root``, from its own backend (the hparams plugin's
    ``Context``, which picks the experiment summary and sorts its hyper-parameters: those whose values
    differ first, then by name): ``shown``, the columns the tab opens with (its frontend shows the first
    five, differing ones first), ``hparams`` (every column, in order) and ``metrics``."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    mux = plugin_event_multiplexer.EventMultiplexer(size_guidance=GUIDANCE).AddRunsFromDirectory(str(log_root))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(log_root))
    plugin = backend_context.Context(
        base_plugin.TBContext(logdir=str(log_root), data_provider=provider, multiplexer=mux)
    )
    ctx = context.RequestContext()
    exp = plugin.experiment_from_metadata(
        ctx, "", True, plugin.hparams_metadata(ctx, ""), plugin.hparams_from_data_provider(ctx, "", limit=None)
    )
    infos = sorted(exp.hparam_infos, key=lambda h: not h.differs)  # the frontend's stable sort
    return {
        "shown": [h.name for h in infos[:5]],
        "hparams": [h.name for h in infos],
        "metrics": [m.name.tag for m in exp.metric_infos],
    }


def hparams_sessions(log_root: str | Path) -> list[dict]:
    """Every hparams session TensorBoard shows under ``log_root``: its run, its hyper-parameters as
    ``{key: (kind, value)}`` (``kind``: the protobuf field set, ``string_value`` or ``number_value``),
    its metric tags and the discrete domains its run's column list declares (none without one: ``experiment``)."""
    mux = event_multiplexer.EventMultiplexer(size_guidance=GUIDANCE).AddRunsFromDirectory(str(log_root))
    mux.Reload()
    out = []
    for run, tags in mux.PluginRunToTagToContent("hparams").items():
        start = plugin_data_pb2.HParamsPluginData.FromString(tags["_hparams_/session_start_info"]).session_start_info
        has_exp = "_hparams_/experiment" in tags  # a replay's session comes without the column list
        exp = plugin_data_pb2.HParamsPluginData.FromString(tags.get("_hparams_/experiment", b"")).experiment
        hp = {k: (v.WhichOneof("kind"), getattr(v, v.WhichOneof("kind"))) for k, v in start.hparams.items()}
        domains = {
            h.name: [getattr(v, v.WhichOneof("kind")) for v in h.domain_discrete.values]
            for h in exp.hparam_infos
            if h.HasField("domain_discrete")
        }
        out.append(
            {
                "run": run,
                "hparams": hp,
                "metrics": [m.name.tag for m in exp.metric_infos],
                "domains": domains,
                "experiment": has_exp,
            }
        )
    return out


@pytest.fixture(scope="session")
def tb() -> SimpleNamespace:
    """The reference reader's functions (``tb.accumulate``, ``tb.scalars``, ``tb.text``, ``tb.hparams_sessions``,
    ``tb.hparams_view``)."""
    return SimpleNamespace(
        accumulate=accumulate,
        scalars=scalars,
        scalar_tags=scalar_tags,
        text=text,
        hparams_sessions=hparams_sessions,
        hparams_view=hparams_view,
    )
