"""Replay satmon's diagnostics over saved checkpoints: the loop that builds one record per checkpoint.

Each checkpoint is built into a model (:class:`ModelLoader`, from the index
:mod:`satmon.replaying.checkpoints` read and the tensors it reads at the checkpoint's turn) and probed
by :func:`satmon.probe` on the same calibration batches (:mod:`satmon.replaying.data`), the code the
live callback runs, so a replayed checkpoint and the live probe at the same step read the same
numbers. Before any weight is read, the model is built on the meta device and compared with the
checkpoint's tensor shapes (:meth:`ModelLoader.mismatch`): hyper-parameters that ask for another (or
a huge) model cost neither memory nor time. Lightning is never imported here: a ``LightningModule``
class is recognised by its bases (the user's class imported Lightning already). ``satmon replay``
(:mod:`satmon.cli.replay`) is a thin command line over it.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# the probe's and the window's count
from satmon.observe.reading_hooks import (
    nonfinite_parameters,
)
from satmon.replaying.checkpoints import (
    CheckpointInfo,
    load_checkpoint,
    meta_state_dict,
    state_dict_of,
)
from satmon.replaying.file_info import CorruptFile, FileChanged
from satmon.replaying.user_code import ReplayUsageError, error_line, printable, short
from satmon.results.live_replay import ReplaySource
from satmon.results.replay_record import ReplayRecord
from satmon.results.verdict import Source
from satmon.settings import Settings, settings_from

__all__ = [
    "TWIN_SEED",
    "ModelLoader",
    "ReplayRecord",
    "ReplayUsageError",
    "checkpoint_records",
    "input_vocabulary",
    "is_lightning_module",
    "nonfinite_parameters",
    "summary_row",
]

#: Seed of the random-init twin: the same twin (and so the same init readings) for every checkpoint.
TWIN_SEED = 0
_LIGHTNING_MODULES = ("lightning.pytorch.core.module", "pytorch_lightning.core.module")


# ------------------------------------------------------------------------------------ building models
def _lightning_base(cls: Any) -> type | None:
    """The ``LightningModule`` class among ``cls``'s bases, found without importing Lightning."""
    if not isinstance(cls, type):
        return None
    return next(
        (c for c in cls.__mro__ if c.__name__ == "LightningModule" and c.__module__ in _LIGHTNING_MODULES), None
    )


def is_lightning_module(cls: Any) -> bool:
    """Whether ``cls`` is a ``LightningModule`` subclass, read from its bases: Lightning is not imported
    (a class that is one has imported it already).

    Example:
        >>> is_lightning_module(torch.nn.Linear), is_lightning_module("LitLM")
        (False, False)
    """
    return _lightning_base(cls) is not None


def _overridden(model: nn.Module | type, name: str) -> bool:
    """``model``'s class overrides the ``LightningModule`` hook ``name`` (Lightning's ``is_overridden``)."""
    cls = model if isinstance(model, type) else type(model)
    base = _lightning_base(cls)
    return base is not None and getattr(cls, name, None) is not getattr(base, name, None)


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


def _new_lightning_module(model_cls: type, hparams: Mapping[str, Any], hparams_name: str | None) -> nn.Module:
    model = model_cls(**_init_kwargs(model_cls, hparams, hparams_name))
    if _overridden(model, "configure_model"):
        model.configure_model()
    return model


#: The architecture key of a ``--factory`` model (one architecture: the factory's).
_FACTORY = ("factory",)


def _arch_key(hparams: Any, hparams_name: Any) -> tuple[Any, ...]:
    """The architecture key of a Lightning model: what its constructor is called with."""
    return ("lightning", hparams_name, hparams)


def _key(k: Any) -> str:
    return (k if len(k) <= 80 else k[:77] + "...") if isinstance(k, str) else short(k, 80)


def _few(keys: Sequence[str], n: int = 3) -> str:
    return ", ".join(_key(k) for k in keys[:n]) + (", ..." if len(keys) > n else "")


def _unfit(model: nn.Module, state: Mapping[str, Tensor], strict: bool = True) -> str | None:
    """How ``state`` (names -> tensors, meta or real) does not fit ``model``, in one line; ``None`` when it fits.

    A key missing from ``state`` is fine when its tensor is shared with a present one (safetensors
    stores a tied weight once). With ``strict=False`` (a module's ``strict_loading``) only shapes count.
    """
    own = model.state_dict(keep_vars=True)
    tied: dict[int, list[str]] = {}
    for k, v in own.items():
        tied.setdefault(id(v), []).append(k)
    missing = [k for k, v in own.items() if k not in state and not any(o in state for o in tied[id(v)])]
    unexpected = [k for k in state if k not in own]
    shapes = [
        (k, tuple(state[k].shape), tuple(v.shape))
        for k, v in own.items()
        if k in state
        and isinstance(v, Tensor)
        and isinstance(state[k], Tensor)
        and tuple(state[k].shape) != tuple(v.shape)
    ]
    if not strict:
        missing, unexpected = [], []
    if not (missing or unexpected or shapes):
        return None
    parts = []
    if missing:
        parts.append(f"{len(missing)} of the model's {len(own)} keys missing from the checkpoint ({_few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} of the checkpoint's {len(state)} keys not in the model ({_few(unexpected)})")
    if shapes:
        shown = "; ".join(f"{_key(k)}: checkpoint {list(a)}, model {list(b)}" for k, a, b in shapes[:2])
        parts.append(f"{len(shapes)} shape(s) differ ({shown}{'; ...' if len(shapes) > 2 else ''})")
    return "; ".join(parts)


def _load_weights(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """``load_state_dict`` that also accepts files without the duplicate of a tied weight (safetensors
    stores a shared tensor once): a missing key is fine when its tensor is shared with a loaded one."""
    problem = _unfit(model, state)
    if problem:
        raise RuntimeError(
            f"the model does not fit this checkpoint: {problem}. Is --model/--factory building the "
            "architecture that saved it?"
        )
    model.load_state_dict(state, strict=False)


class ModelLoader:
    """Builds the trained model of an inspected checkpoint, and its random-init twin, one at a time.

    The weights are read from the checkpoint's file(s) when the model is built
    (:func:`satmon.replaying.checkpoints.state_dict_of`), after :meth:`mismatch` compared the model,
    built on the meta device, with the checkpoint's tensor shapes.

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

    def __init__(
        self,
        model_cls: type | None = None,
        factory: Callable[[], nn.Module] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if model_cls is None and factory is None:
            raise ReplayUsageError(
                "Pass --model MODULE:CLASS (a LightningModule, for .ckpt files) or --factory "
                "MODULE:FUNCTION (returns the nn.Module, for plain state_dict files)."
            )
        self.model_cls, self.factory, self.device = model_cls, factory, torch.device(device)
        self._shapes: list[tuple[Any, nn.Module | None]] = []  # (hyper-parameters, meta model) of recent checks
        # one model (and one twin) per architecture, the next checkpoint's weights loaded into it: building a model
        # (and garbage-collecting the last one) cost more than probing a small one
        # (architecture key, model, what lies outside its state_dict when it was built: see _outside_state)
        self._built: tuple[Any, nn.Module, list] | None = None
        self._twin: tuple[Any, nn.Module, list] | None = None

    def _lightning(self, info: CheckpointInfo) -> bool:
        return info.kind == "lightning" and self.model_cls is not None

    def check(self, info: CheckpointInfo) -> str | None:
        """Why this loader cannot build ``info`` at all (``None`` when it can)."""
        if info.kind == "state_dict" and self.factory is None:
            what = "a Hugging Face checkpoint folder" if info.hf else "a plain state_dict file"
            return f"{what} needs --factory MODULE:FUNCTION (a function returning the nn.Module)"
        return None

    def mismatch(self, info: CheckpointInfo) -> str | None:
        """How the model this loader builds does not fit ``info``'s tensors, in one line; ``None`` when it
        fits, or when the model cannot be built on the meta device (building it for real decides then).

        Costs no weight read and no memory: the model is built on the meta device (once per distinct
        hyper-parameters) and compared with the names and shapes of the checkpoint's index.
        """
        if self.check(info) is not None:
            return None
        try:
            state = meta_state_dict(info)
        except ValueError:
            return None
        lightning = self._lightning(info)
        model = self._meta_model(info, lightning)
        if model is None:
            return None
        if lightning and _overridden(model, "on_load_checkpoint"):  # the hook may rename keys: run it on a copy
            shadow = dict(info.checkpoint)
            shadow["state_dict"] = dict(state)
            try:
                model.on_load_checkpoint(shadow)
            except Exception:
                return None
            state = shadow["state_dict"]
        problem = _unfit(model, state, strict=bool(getattr(model, "strict_loading", True)) if lightning else True)
        if problem is None:
            return None
        how = (
            f"{getattr(self.model_cls, '__name__', 'the model')}(**hyper_parameters)"
            if lightning
            else "the --factory model"
        )
        return (
            f"the model built by {how} does not fit this checkpoint: {problem}. Is --model/--factory "
            "building the architecture that saved it?"
        )

    def vocabulary(self, info: CheckpointInfo) -> tuple[int, str] | None:
        """The size of the vocabulary the model built for ``info`` reads its token ids from, and the layer that holds
        it (built on the meta device: no weight read); ``None`` when it has no embedding table or cannot be built
        there. Which table takes the ids is known when the model says (Hugging Face's ``get_input_embeddings``);
        otherwise the largest ``nn.Embedding`` bounds them: an id past it is past every table."""
        if self.check(info) is not None:
            return None
        model = self._meta_model(info, self._lightning(info))
        return None if model is None else input_vocabulary(model)

    def _meta_model(self, info: CheckpointInfo, lightning: bool) -> nn.Module | None:
        key = _arch_key(info.hparams, info.hparams_name) if lightning else _FACTORY
        hook = lightning and _overridden(self.model_cls, "on_load_checkpoint")  # the model may change per checkpoint
        if not hook:
            for seen, model in self._shapes:
                if _same(seen, key):  # hyper-parameters that cannot be compared never are
                    return model
        try:
            with torch.device("meta"), torch.random.fork_rng(devices=[]):
                model = (
                    _new_lightning_module(self.model_cls, info.hparams, info.hparams_name)
                    if lightning
                    else self._fresh()
                )
        except Exception:  # a constructor that needs real tensors: the real build decides
            model = None
        if not hook:
            self._shapes = [(key, model), *self._shapes[:3]]
        return model

    def load(self, info: CheckpointInfo) -> nn.Module:
        """The trained model, in eval mode on ``device``; its weights read from the file(s) now.

        The model of the previous checkpoint is reused when it has the same architecture (the same
        hyper-parameters, or the same ``factory``) and every one of its weights is overwritten: a strict
        load, and no ``on_load_checkpoint`` of the module's own (which may change the model per
        checkpoint). Otherwise a fresh model is built, as ``load_from_checkpoint`` builds it.

        Raises:
            satmon.replaying.file_info.FileChanged: a file changed since it was listed.
        """
        try:
            if self._lightning(info):
                ckpt = load_checkpoint(info)
                hparams, name = ckpt.get("hyper_parameters") or {}, ckpt.get("hparams_name")
                key = None if _overridden(self.model_cls, "on_load_checkpoint") else _arch_key(hparams, name)
                model = self._reusable(self._built, key)
                if model is None or not getattr(model, "strict_loading", True):  # a partial load keeps stale weights
                    model = _new_lightning_module(self.model_cls, hparams, name)
                model.on_load_checkpoint(ckpt)  # Lightning's hook, as load_from_checkpoint calls it
                model.load_state_dict(ckpt["state_dict"], strict=getattr(model, "strict_loading", True))
            else:
                state = state_dict_of(info)
                key = _FACTORY
                model = self._reusable(self._built, key) or self._fresh()
                _load_weights(model, state)  # strict: every weight (or its tied twin) in the file
        except BaseException:
            self._keep("built", None, None)  # a half-loaded model is never reused
            raise
        model = model.to(self.device).eval()
        self._keep("built", key, model)
        return model

    def twin(self, info: CheckpointInfo) -> nn.Module:
        """A random-init instance of the same architecture, seeded with ``TWIN_SEED`` (built once per architecture:
        the probe never writes its parameters)."""
        lightning = self._lightning(info)
        key = _arch_key(info.hparams, info.hparams_name) if lightning else _FACTORY
        kept = self._reusable(self._twin, key)
        if kept is not None:
            return kept
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TWIN_SEED)
            model = (
                _new_lightning_module(self.model_cls, info.hparams, info.hparams_name) if lightning else self._fresh()
            )
        model = model.to(self.device).eval()
        self._keep("twin", key, model)
        return model

    def forget(self) -> None:
        """Drop the models kept for the next checkpoint (after a failed load or probe: never reused)."""
        self._keep("built", None, None)
        self._keep("twin", None, None)

    @staticmethod
    def _reusable(kept: tuple[Any, nn.Module, list] | None, key: Any) -> nn.Module | None:
        """The model in ``kept`` (``_built`` or ``_twin``) when ``key`` (its architecture) is the same."""
        if key is None or kept is None or not _same(kept[0], key):
            return None
        if not _unchanged(kept[1], kept[2]):  # a forward left state no load overwrites: build afresh
            return None
        return kept[1]

    def _keep(self, which: str, key: Any, model: nn.Module | None) -> None:
        """Keep ``model`` for the next checkpoint; a model it replaces is collected now (once per architecture
        change, not per checkpoint: a full ``gc.collect`` of a process holding torch costs ~0.2 s)."""
        slot = "_built" if which == "built" else "_twin"
        old = getattr(self, slot)
        if model is None or key is None:
            setattr(self, slot, None)
        elif old is None or old[1] is not model:  # a model built now: what lies outside its state_dict, as built
            setattr(self, slot, (key, model, _outside_state(model)))
        if old is not None and old[1] is not model:
            del old
            _release(self.device)

    def _fresh(self) -> nn.Module:
        assert self.factory is not None
        model = self.factory()
        if not isinstance(model, nn.Module):
            raise TypeError(f"Expected --factory to return an nn.Module, got {type(model).__name__}")
        return model


_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # _parameters, _buffers, _modules, the hooks, training...


def input_vocabulary(model: nn.Module) -> tuple[int, str] | None:
    """``(number of token ids, the layer's name)`` of the table ``model`` reads its input token ids from: the one
    ``get_input_embeddings()`` returns, else the largest ``nn.Embedding`` (an upper bound); ``None`` without one.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Embedding(50, 4), torch.nn.Embedding(8, 4))
        >>> input_vocabulary(net)
        (50, '0')
    """
    names = {id(m): n for n, m in model.named_modules()}
    getter = getattr(model, "get_input_embeddings", None)
    if callable(getter):
        try:
            table = getter()
        except Exception:
            table = None
        if isinstance(table, nn.Embedding) and id(table) in names:
            return int(table.num_embeddings), names[id(table)]
    tables = [(int(m.num_embeddings), n) for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    return max(tables, key=lambda t: t[0]) if tables else None


def _items(value: Any) -> Any:
    """The identity of a container's items (a cache filled in place changes it); ``None`` for anything else."""
    if isinstance(value, (list, tuple)):
        return tuple(id(v) for v in value)
    if isinstance(value, dict):
        return tuple((id(k), id(v)) for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return frozenset(id(v) for v in value)
    return None


def _outside_state(model: nn.Module) -> list[tuple[nn.Module, dict[str, Tensor], dict[str, tuple[Any, Any]]]]:
    """What a forward can change in ``model`` that no ``load_state_dict`` overwrites: each submodule's
    non-persistent buffers (copied) and its plain attributes (the objects, and a container's items)."""
    snapshot = []
    for module in model.modules():
        buffers = {
            k: b.detach().clone()
            for k, b in module._buffers.items()
            if b is not None and k in module._non_persistent_buffers_set
        }
        attrs = {k: (v, _items(v)) for k, v in vars(module).items() if k not in _MODULE_INTERNALS}
        snapshot.append((module, buffers, attrs))
    return snapshot


def _unchanged(
    model: nn.Module, snapshot: list[tuple[nn.Module, dict[str, Tensor], dict[str, tuple[Any, Any]]]]
) -> bool:
    """Whether ``model`` still holds, outside its state_dict, what it held when built: then loading the next
    checkpoint's weights into it gives the model a fresh build would give (a cache filled by a forward, a
    buffer a forward updates, a submodule added later: it is not reused)."""
    modules = list(model.modules())
    if len(modules) != len(snapshot) or any(m is not s[0] for m, s in zip(modules, snapshot)):
        return False
    for module, buffers, attrs in snapshot:
        now = {k: b for k, b in module._buffers.items() if b is not None and k in module._non_persistent_buffers_set}
        if now.keys() != buffers.keys() or any(
            now[k].shape != b.shape or now[k].dtype != b.dtype or not torch.equal(now[k], b) for k, b in buffers.items()
        ):
            return False
        plain = {k: v for k, v in vars(module).items() if k not in _MODULE_INTERNALS}
        if plain.keys() != attrs.keys() or any(
            not _same_value(plain[k], v) or _items(plain[k]) != items for k, (v, items) in attrs.items()
        ):
            return False
    return True


_SCALARS = (bool, int, float, complex, str, bytes, torch.device, torch.dtype)


def _same_value(now: Any, then: Any) -> bool:
    """The same object, or an equal scalar (``LightningModule.to`` sets a new ``torch.device`` each time)."""
    return now is then or (type(now) is type(then) and isinstance(now, _SCALARS) and bool(now == then))


def _same(a: Any, b: Any) -> bool:
    """Whether two architecture keys are equal (hyper-parameters that cannot be compared never are)."""
    try:
        return bool(a == b)
    except Exception:
        return False


# ---------------------------------------------------------------------------------------- the loop
def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _replay_one(
    info: CheckpointInfo,
    loader: ModelLoader,
    batches: Sequence[Any],
    step: int | None,
    settings: Settings,
    kwargs: Mapping[str, Any],
    twin: bool,
) -> ReplayRecord:
    """Build, check and probe one checkpoint; its record, built here once (an error record
    when it cannot be replayed)."""
    from satmon.model.map import model_map
    from satmon.probing.passes import probe

    notes, report, seconds, nonfinite = list(info.notes), None, None, 0
    error = info.error or loader.check(info) or loader.mismatch(info)
    if error is None:
        t0 = time.perf_counter()
        model = twin_model = None
        try:
            model = loader.load(info)
            info.release()  # the weights now live in the model: the index can go
            bad = nonfinite_parameters(model)
            if bad:
                nonfinite = sum(bad.values())
                notes.append(
                    f"{nonfinite:,} non-finite (NaN/inf) parameter element(s) in "
                    + ", ".join(f"{n} ({c:,})" for n, c in list(bad.items())[:6])
                    + ("..." if len(bad) > 6 else "")
                )
            # the twin only feeds the LayerNorm/RMSNorm init-gap: a DyT-only model skips it (half the cost); the model
            # map is read once here, and the probe reads the same (cached) map
            twin_model = loader.twin(info) if twin and model_map(model).layers(("layernorm", "rmsnorm")) else None
            report = probe(
                model, batches, settings=settings, twin=twin_model, step=int(step or 0), source=Source.REPLAY, **kwargs
            )
            seconds = round(time.perf_counter() - t0, 3)
        except (FileChanged, CorruptFile) as e:
            error, report = str(e), None
        except Exception as e:  # an incompatible checkpoint (shapes, missing keys...) is skipped, not fatal
            error, report = error_line(e), None
        finally:
            if report is None:  # whatever failed, the next checkpoint gets models built afresh
                loader.forget()
            del model, twin_model  # the loader keeps one model per architecture for the next checkpoint
    return ReplayRecord(
        checkpoint=printable(str(info.path)),
        global_step=step,
        report=report,
        seconds=seconds,
        weights_only=info.weights_only,
        nonfinite_weights=nonfinite,
        notes=tuple(map(printable, notes)),
        error=None if error is None else printable(error),
    )


def checkpoint_records(
    infos: Sequence[CheckpointInfo],
    loader: ModelLoader,
    batches: Sequence[Any],
    *,
    settings: Settings | None = None,
    probe_kwargs: Mapping[str, Any] | None = None,
    twin: bool = True,
    on_record: Callable[[ReplayRecord], None] | None = None,
    source: ReplaySource | None = None,
) -> Iterator[ReplayRecord]:
    """Probe each checkpoint in turn, one model in memory at a time; yields one :class:`ReplayRecord` per checkpoint.

    A checkpoint that cannot be read, built or probed, or whose file changed since it was listed,
    becomes a record with ``error`` set; the loop goes on.

    Args:
        infos: from :func:`satmon.replaying.checkpoints.inspect_checkpoint` (ordered); each one's index is
            released once its model is built.
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
        source: the run the checkpoints come from and its live verdict
            (:func:`satmon.replaying.live.find_source`), kept in every record: its card shows both readings.

    Example:
        >>> import os, tempfile
        >>> from satmon.replaying.checkpoints import inspect_checkpoint
        >>> net = lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        >>> f = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"model": net().state_dict(), "iter_num": 5}, f)
        >>> batches = [torch.randn(8, 4)]
        >>> (record,) = checkpoint_records([inspect_checkpoint(f)], ModelLoader(factory=net), batches, twin=False)
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
        record = _replay_one(info, loader, batches, step, settings, kwargs, twin)
        if source is not None:
            record = dataclasses.replace(record, source=source)
        info.release()
        if on_record is not None:
            on_record(record)
        yield record


# ------------------------------------------------------------------------------------------ outputs
def summary_row(record: ReplayRecord | Mapping[str, Any]) -> dict[str, Any]:
    """The key readings of one record, flat: ``step``, ``name``, ``saturation``, ``decision`` (with the verdict's
    ``trust`` in brackets when it is not ``"ok"``: ``"GO (flagged)"``), ``margin``,
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
        if verdict.get("trust") not in (None, "ok"):  # a qualified decision never reads as a bare GO / NO-GO
            decision += f" ({verdict['trust']})"
    sigma = rec.get("sigma_min") or {}
    ratios = [r for r in (sigma.get("ratios") or []) if isinstance(r, (int, float)) and r == r]
    aligns = [
        v["alignment"]
        for v in (rec.get("layers") or {}).values()
        if isinstance(v, Mapping) and isinstance(v.get("alignment"), (int, float))
    ]
    norm_type = rec.get("norm_type")
    if isinstance(norm_type, Mapping):
        norm_type = norm_type.get("type") or norm_type.get("norm_type")
    sat = verdict.get("saturation")
    sat = rec.get("saturation") if sat is None else sat
    if isinstance(sat, Mapping):
        sat = sat.get("pooled")
    weights, inputs = int(rec.get("nonfinite_weights") or 0), int(verdict.get("nonfinite") or 0)
    nonfinite = ", ".join(
        t for t in (f"{weights:,} weights" if weights else "", f"{inputs:,} DyT inputs" if inputs else "") if t
    )
    return {
        "step": rec.get("global_step"),
        "name": Path(str(rec["checkpoint"])).name,
        "saturation": float(sat) if isinstance(sat, (int, float)) else None,
        "decision": decision,
        "margin": verdict.get("margin"),
        "norm_type": norm_type,
        "min_ratio": sigma.get("min_ratio", min(ratios) if ratios else None),
        "min_alignment": min(aligns) if aligns else None,
        "nonfinite": nonfinite or None,
        "seconds": rec.get("seconds"),
        "error": rec.get("error"),
    }
