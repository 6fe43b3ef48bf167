"""Replay satmon's diagnostics over saved checkpoints: the loop, and its typed records.

Each checkpoint is built into a model (:class:`ModelLoader`, from what :mod:`satmon.replay.checkpoints`
read once) and probed by :func:`satmon.probe` on the same calibration batches
(:mod:`satmon.replay.data`), the code the live callback runs, so a replayed checkpoint and the
live probe at the same step read the same numbers. ``satmon replay`` (:mod:`satmon.cli.replay`) is a
thin command line over it.
"""

from __future__ import annotations

import gc
import inspect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from satmon.replay.checkpoints import CheckpointInfo, state_dict_of
from satmon.replay.user_code import ReplayUsageError, error_line
from satmon.results.verdict import Source, Verdict
from satmon.settings import Settings, settings_from

if TYPE_CHECKING:
    from satmon.results.probe_report import ProbeReport

__all__ = ["TWIN_SEED", "ModelLoader", "ReplayRecord", "ReplayUsageError", "nonfinite_parameters", "replay", "summary_row"]

#: Seed of the random-init twin: the same twin (and so the same init readings) for every checkpoint.
TWIN_SEED = 0


# ------------------------------------------------------------------------------------------ records
@dataclass
class ReplayRecord:
    """One checkpoint's replay: the probe's report, or why the file was skipped.

    Attributes:
        checkpoint: the file.
        global_step: the step stored in the file (its position when it holds none; ``None`` when unreadable).
        report: what :func:`satmon.probe` read (``None`` when skipped); its verdict is stepped at
            ``global_step`` and has ``source="replay"``.
        seconds: load + twin + probe wall time.
        weights_only: the file was read with ``torch.load(weights_only=True)``.
        nonfinite_weights: parameter elements that are NaN or inf in the built model.
        notes: what the reader should know (no step in the file, which parameters are non-finite...).
        error: why the checkpoint was skipped; ``None`` when it was replayed.

    Example:
        >>> ReplayRecord("ckpts/a.ckpt", None, error="not a PyTorch checkpoint: an empty file").to_dict()
        {'checkpoint': 'ckpts/a.ckpt', 'global_step': None, 'error': 'not a PyTorch checkpoint: an empty file'}
    """

    checkpoint: str
    global_step: int | None
    report: ProbeReport | None = None
    seconds: float | None = None
    weights_only: bool = True
    nonfinite_weights: int = 0
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def verdict(self) -> Verdict | None:
        """The report's :class:`~satmon.results.verdict.Verdict` (``None`` when skipped or without DyT)."""
        return None if self.report is None else self.report.verdict

    @property
    def nonfinite(self) -> bool:
        """NaN/inf in the weights or in a DyT layer's input: the model diverged (``satmon replay`` exit code 3)."""
        return self.nonfinite_weights > 0 or bool(self.verdict is not None and self.verdict.nonfinite)

    def to_dict(self) -> dict[str, Any]:
        """The record ``satmon replay --json`` writes (after :func:`satmon.io.json_records.to_json`, which
        turns NaN/inf into ``null``): the probe report's keys between the file's and the replay's."""
        out: dict[str, Any] = {"checkpoint": self.checkpoint, "global_step": self.global_step}
        if self.error is not None:
            out["error"] = self.error
            if self.nonfinite_weights:
                out["nonfinite_weights"] = self.nonfinite_weights
        else:
            out.update(self.report.to_dict())
            out.update(seconds=self.seconds, weights_only=self.weights_only, nonfinite_weights=self.nonfinite_weights)
        if self.notes:
            out["notes"] = list(self.notes)
        return out



# ------------------------------------------------------------------------------------ building models
def _init_kwargs(model_cls: type, hparams: Mapping[str, Any], hparams_name: str | None) -> dict[str, Any]:
    """The constructor arguments Lightning's ``load_from_checkpoint`` would pass (hyper-parameters
    filtered by the ``__init__`` signature unless it takes ``**kwargs``; wrapped when saved under a name)."""
    params = inspect.signature(model_cls.__init__).parameters
    named = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)} - {"self"}
    if hparams_name and hparams_name in named:
        return {hparams_name: dict(hparams)}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(hparams)
    return {k: v for k, v in hparams.items() if k in named}


def _new_lightning_module(model_cls: type, checkpoint: Mapping[str, Any]) -> nn.Module:
    from lightning.pytorch.utilities.model_helpers import is_overridden

    model = model_cls(**_init_kwargs(model_cls, checkpoint.get("hyper_parameters") or {}, checkpoint.get("hparams_name")))
    if is_overridden("configure_model", model):
        model.configure_model()
    return model


def _load_weights(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """``load_state_dict`` that also accepts files without the duplicate of a tied weight (safetensors
    stores a shared tensor once): a missing key is fine when its tensor is shared with a loaded one."""
    result = model.load_state_dict(state, strict=False)
    own = model.state_dict(keep_vars=True)
    loaded = {own[k].data_ptr() for k in state if k in own}
    missing = [k for k in result.missing_keys if own[k].data_ptr() not in loaded]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}: missing keys {missing[:6]}, "
                           f"unexpected keys {list(result.unexpected_keys)[:6]}: is --factory building the right architecture?")


class ModelLoader:
    """Builds the trained model of an inspected checkpoint, and its random-init twin, one at a time.

    Nothing is read from disk again: the weights come from what :func:`satmon.replay.checkpoints.inspect_checkpoint`
    loaded (``.safetensors`` tensors are read here).

    Args:
        model_cls: a ``LightningModule`` class: a ``.ckpt`` is rebuilt as ``load_from_checkpoint`` does
            (``model_cls(**hyper_parameters)``, ``configure_model``, ``on_load_checkpoint``, strict
            ``load_state_dict``) and the twin is ``model_cls(**hyper_parameters)``.
        factory: a callable returning a fresh ``nn.Module``: plain state-dict files (and ``.ckpt`` files
            when no ``model_cls`` is given) are loaded into it; the twin is another ``factory()``.
        device: where the model lives.

    Example:
        >>> loader = ModelLoader(factory=lambda: torch.nn.Linear(2, 2))
        >>> loader.check(CheckpointInfo(Path("w.pt"))) is None
        True
    """

    def __init__(self, model_cls: type | None = None, factory: Callable[[], nn.Module] | None = None,
                 device: torch.device | str = "cpu") -> None:
        if model_cls is None and factory is None:
            raise ReplayUsageError("Pass --model MODULE:CLASS (a LightningModule, for .ckpt files) or --factory "
                                   "MODULE:FUNCTION (returns the nn.Module, for plain state_dict files).")
        self.model_cls, self.factory, self.device = model_cls, factory, torch.device(device)

    def check(self, info: CheckpointInfo) -> str | None:
        """Why this loader cannot build ``info`` (``None`` when it can)."""
        if info.kind == "state_dict" and self.factory is None:
            return "a plain state_dict file needs --factory MODULE:FUNCTION (a function returning the nn.Module)"
        return None

    def load(self, info: CheckpointInfo) -> nn.Module:
        """The trained model, in eval mode on ``device``."""
        if info.kind == "lightning" and self.model_cls is not None:
            ckpt = info.checkpoint
            if ckpt is None:
                raise ValueError(f"Expected the checkpoint inspect_checkpoint loaded from {info.path}, got None (already used).")
            model = _new_lightning_module(self.model_cls, ckpt)
            model.on_load_checkpoint(ckpt)  # Lightning's hook, as load_from_checkpoint calls it
            model.load_state_dict(ckpt["state_dict"], strict=model.strict_loading)  # True unless the module set it
        else:
            model = self._fresh()
            _load_weights(model, state_dict_of(info))
        return model.to(self.device).eval()

    def twin(self, info: CheckpointInfo) -> nn.Module:
        """A random-init instance of the same architecture, seeded with ``TWIN_SEED``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TWIN_SEED)
            if info.kind == "lightning" and self.model_cls is not None:
                model = _new_lightning_module(self.model_cls, {"hyper_parameters": info.hparams,
                                                               "hparams_name": info.hparams_name})
            else:
                model = self._fresh()
        return model.to(self.device).eval()

    def _fresh(self) -> nn.Module:
        assert self.factory is not None
        model = self.factory()
        if not isinstance(model, nn.Module):
            raise TypeError(f"Expected --factory to return an nn.Module, got {type(model).__name__}")
        return model


def nonfinite_parameters(model: nn.Module) -> dict[str, int]:
    """Parameter name -> NaN/inf element count, for the parameters that hold any (buffers such as
    attention masks may hold ``-inf`` on purpose and are not counted).

    Example:
        >>> lin = torch.nn.Linear(2, 1)
        >>> with torch.no_grad():
        ...     _ = lin.bias.fill_(float("nan"))
        >>> nonfinite_parameters(lin)
        {'bias': 1}
    """
    counts = {n: int((~torch.isfinite(p)).sum()) for n, p in model.named_parameters() if p.is_floating_point()}
    return {n: c for n, c in counts.items() if c}


# ---------------------------------------------------------------------------------------- the loop
def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _probe_one(info: CheckpointInfo, loader: ModelLoader, batches: Sequence[Any], record: ReplayRecord,
               settings: Settings, kwargs: Mapping[str, Any], twin: bool) -> None:
    """Build, check and probe one checkpoint into ``record`` (raises on an incompatible checkpoint)."""
    from satmon.model.discovery import find_norm_layers
    from satmon.probing.passes import probe

    t0 = time.perf_counter()
    model = twin_model = None
    try:
        model = loader.load(info)
        info.checkpoint = None  # the weights now live in the model: the loaded file can go
        bad = nonfinite_parameters(model)
        if bad:
            record.nonfinite_weights = sum(bad.values())
            record.notes.append(f"{record.nonfinite_weights:,} non-finite (NaN/inf) parameter element(s) in "
                                + ", ".join(f"{n} ({c:,})" for n, c in list(bad.items())[:6]) + ("..." if len(bad) > 6 else ""))
        # the twin only feeds the LayerNorm/RMSNorm init-gap: a DyT-only model skips it (half the cost)
        twin_model = loader.twin(info) if twin and find_norm_layers(model, kinds=("layernorm", "rmsnorm")) else None
        record.report = probe(model, batches, settings=settings, twin=twin_model, step=int(record.global_step or 0),
                              source=Source.REPLAY, **kwargs)
        record.seconds = round(time.perf_counter() - t0, 3)
    finally:
        del model, twin_model
        _release(loader.device)


def replay(
    infos: Sequence[CheckpointInfo],
    loader: ModelLoader,
    batches: Sequence[Any],
    *,
    settings: Settings | None = None,
    probe_kwargs: Mapping[str, Any] | None = None,
    twin: bool = True,
    on_record: Callable[[ReplayRecord], None] | None = None,
) -> Iterator[ReplayRecord]:
    """Probe each checkpoint in turn, one model in memory at a time; yields one :class:`ReplayRecord` per file.

    A checkpoint that cannot be read, built or probed becomes a record with ``error`` set; the loop goes on.

    Args:
        infos: from :func:`satmon.replay.checkpoints.inspect_checkpoint` (ordered); each one's loaded object
            is released once its model is built.
        loader: builds each model and its twin.
        batches: calibration batches, the same for every checkpoint.
        settings: the rule and the selection every checkpoint is read with (a :class:`satmon.Settings`,
            passed whole to :func:`satmon.probe`); ``None``: the study's, or built from the
            :class:`~satmon.Settings` fields in ``probe_kwargs``.
        probe_kwargs: :func:`satmon.probe`'s own arguments (``forward_fn``, ``device``, ``autocast_dtype``,
            ``max_dim``...); Settings fields (``threshold``, ``level``...) only without ``settings``.
        twin: also probe a random-init twin, for the init-to-trained readout.
        on_record: called with each record before it is yielded, e.g. a
            :class:`~satmon.io.tensorboard_replay.TensorBoardReplay`.

    Example:
        >>> import os, tempfile
        >>> from satmon.replay.checkpoints import inspect_checkpoint
        >>> net = lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        >>> f = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"model": net().state_dict(), "iter_num": 5}, f)
        >>> (record,) = replay([inspect_checkpoint(f)], ModelLoader(factory=net), [torch.randn(8, 4)], twin=False)
        >>> record.global_step, record.error, record.report.layers["1"].kind
        (5, None, 'layernorm')
    """
    kwargs = dict(probe_kwargs or {})
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in Settings.names()}
    settings = settings_from(settings, fields, owner="replay")  # checked once, before any checkpoint
    position = 0
    for info in infos:
        step = position if info.error is None and info.global_step is None else info.global_step
        position += info.error is None
        record = ReplayRecord(checkpoint=str(info.path), global_step=step, weights_only=info.weights_only,
                              notes=list(info.notes))
        record.error = info.error or loader.check(info)
        if record.error is None:
            try:
                _probe_one(info, loader, batches, record, settings, kwargs, twin)
            except Exception as e:  # an incompatible checkpoint (shapes, missing keys...) is skipped, not fatal
                record.error, record.report = error_line(e), None
        info.checkpoint = None
        if on_record is not None:
            on_record(record)
        yield record


# ------------------------------------------------------------------------------------------ outputs
def summary_row(record: ReplayRecord | Mapping[str, Any]) -> dict[str, Any]:
    """The key readings of one record, flat: ``step``, ``name``, ``saturation``, ``decision``, ``margin``,
    ``norm_type``, ``min_ratio`` (sigma_min over depth), ``min_alignment``, ``nonfinite`` (NaN/inf
    weights and DyT inputs in words, ``None`` when there are none), ``seconds``, ``error``.

    Example:
        >>> summary_row({"checkpoint": "a/s.ckpt", "global_step": 3, "nonfinite_weights": 12,
        ...              "verdict": {"decision": "non-finite", "nonfinite": 2, "saturation": 0.1}})["nonfinite"]
        '12 weights, 2 DyT inputs'
    """
    rec = record.to_dict() if isinstance(record, ReplayRecord) else record
    verdict = rec.get("verdict") or {}
    decision = None
    if verdict.get("decision"):
        decision = str(verdict["decision"]).upper() + (" (collapse risk)" if verdict.get("collapse_risk") else "")
    sigma = rec.get("sigma_min") or {}
    ratios = [r for r in (sigma.get("ratios") or []) if isinstance(r, (int, float)) and r == r]
    aligns = [v["alignment"] for v in (rec.get("layers") or {}).values()
              if isinstance(v, Mapping) and isinstance(v.get("alignment"), (int, float))]
    norm_type = rec.get("norm_type")
    if isinstance(norm_type, Mapping):
        norm_type = norm_type.get("type") or norm_type.get("norm_type")
    sat = verdict.get("saturation")
    sat = rec.get("saturation") if sat is None else sat
    if isinstance(sat, Mapping):
        sat = sat.get("pooled")
    weights, inputs = int(rec.get("nonfinite_weights") or 0), int(verdict.get("nonfinite") or 0)
    nonfinite = ", ".join(t for t in (f"{weights:,} weights" if weights else "", f"{inputs:,} DyT inputs" if inputs else "") if t)
    return {
        "step": rec.get("global_step"), "name": Path(str(rec["checkpoint"])).name,
        "saturation": float(sat) if isinstance(sat, (int, float)) else None, "decision": decision,
        "margin": verdict.get("margin"), "norm_type": norm_type, "min_ratio": sigma.get("min_ratio", min(ratios) if ratios else None),
        "min_alignment": min(aligns) if aligns else None, "nonfinite": nonfinite or None,
        "seconds": rec.get("seconds"), "error": rec.get("error"),
    }

