"""``LiveProbe``: run :func:`satmon.probing.passes.probe` during training on a fixed calibration set, and log it.

Lightning glue only: the readings come from :func:`satmon.probing.passes.probe` (the same call ``satmon
replay`` makes on saved checkpoints), the tags from :class:`satmon.io.tags.TAG`.
:class:`satmon.SaturationMonitor` owns one when ``probe_every_n_steps`` or ``probe_on_checkpoint``
is set; it can also be driven by hand (``capture`` once, then ``maybe_run`` / ``run``).

Calibration set. ``capture`` takes the first ``calibration_batches`` batches of
``trainer.train_dataloader`` once, at train start, clones them to CPU and keeps them for the whole
run, so readings at different steps see the same tokens and form a trajectory. Drawing them does not
disturb training: the global RNG state is restored and a persistent-worker loader is read through a
copy. They are not saved in checkpoints (a resumed run captures again from its own loader).

DDP. Every rank runs the probe on its own calibration batches (its shard of the loader): the
forward with hooks is local, no collective runs, and the cost is the same on every rank. Only
rank zero logs and warns, so the logged readings are rank zero's.

Warnings (each at most once per run, naming the layer or block):

- a LayerNorm whose kernel alignment (:meth:`satmon.results.probe_report.LayerReading.kernel_alignment`, the
  better of ``|cos(v*, u_min)|`` and the null-space projection) falls below
  ``alignment_warn_below = 0.99``. The kernel is exact algebra for any weights: the paper reads
  >= 0.9999 at random init on 9/9 models and >= 0.998 along a training run (Pythia-1B); 0.99 sits
  below every reported value. Read the layer's forward dtype first: a bf16 forward blurs the kernel.
- a block whose ``sigma_min`` ratio falls below ``ratio_warn_below = 1.0`` (the paper's anomaly
  signal: a block's update anti-aligns with the residual stream), at a probe from step 1 on, when
  either every block read >= 1 at an earlier probe of the run (the invariance held, then broke) or
  the ratio is below ``SEVERE_RATIO = 0.5`` (a drop of more than 2x; the paper's one exception
  dropped ~18x). Random-init blocks are not bound by the invariance and read below 1 for a while:
  the demo GPT with LayerNorm reads 0.85-0.89 at step 0, 0.97-0.99 at step 5 and > 1.03 from step
  10 (on its text corpus); a tiny model on random tokens can stay at ~0.75 for its first steps.
  Neither warns; a block that drops below 1 later, or far below it at any time, does.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import CombinedLoader, rank_zero_warn
from torch.utils.data import DataLoader

from satmon.batches import feed_first
from satmon.io.lightning import LightningSink
from satmon.io.tensorboard import log_scalars, probe_scalars
from satmon.paths import CALIBRATION_FILE
from satmon.probing.passes import OWN_OPTIONS, check_options, probe
from satmon.replaying.data import capture_batches
from satmon.results.probe_report import ProbeReport
from satmon.settings import Settings, settings_from, short_repr

__all__ = ["LiveProbe"]

ALIGNMENT_WARN_BELOW = 0.99
RATIO_WARN_BELOW = 1.0
SEVERE_RATIO = 0.5


class LiveProbe:
    """Probe the training model every ``every_n_steps`` optimizer steps and/or at each checkpoint save.

    Logs :func:`satmon.io.tensorboard.probe_scalars` at the global step: ``satmon/deadir/<layer>/...``,
    ``satmon/sigma_min/ratio/<block>``, ``satmon/sigma_min/min_ratio``. DyT saturation tags are
    left out by default (``log_saturation=False``): during the window the monitor logs
    ``satmon/saturation`` from the training forwards, and two measurements under one tag would not
    read as one curve; the probe's DyT readings stay in :attr:`reports`.

    Args:
        every_n_steps: probe when ``global_step % every_n_steps == 0`` (step 0 included, at train
            start); ``None``: not on a schedule.
        on_checkpoint: probe whenever a checkpoint is saved (never twice for one step).
        calibration_batches: batches taken from the training loader at train start.
        forward_fn: ``forward_fn(model, batch)``; default :func:`satmon.batches.feed_first`: a
            tuple/list batch feeds ``model(batch[0])`` (Lightning's ``(x, y)``), a dict
            ``model(**batch)``, a tensor ``model(batch)``.
        log_saturation: also log the probe's DyT saturation tags.
        alignment_warn_below: LayerNorm kernel alignment below this warns (once).
        ratio_warn_below: a block's ``sigma_min`` ratio below this warns (once; from step 1 on, after
            the invariance held or by more than 2x: see the module notes).
        settings: the rule and the selection the probe reads with (:class:`satmon.Settings`):
            :class:`satmon.SaturationMonitor` passes its own, so the probe counts with the monitor's
            ``level``, ``product``, ``include``/``exclude`` and ``gating_mapping``, and its verdict has the
            monitor's threshold and caveat (a calibration's, under ``calibration=``). Default: the study's.
        probe_kwargs: more :func:`satmon.probing.passes.probe` arguments (``layers``, ``blocks``,
            ``autocast_dtype``, ``max_dim``, ``memory_budget``...), checked here; without ``settings``,
            :class:`satmon.Settings` fields too (``threshold=``...).

    Attributes:
        reports: ``[(global_step, ProbeReport), ...]`` of this run, oldest first (small: no matrices).

    Example:
        >>> settings = Settings(product="exact")
        >>> live = LiveProbe(every_n_steps=100, on_checkpoint=True, calibration_batches=2, settings=settings)
        >>> live.active, live.reports, live.settings.product
        (True, [], 'exact')
    """

    def __init__(
        self,
        every_n_steps: int | None = None,
        on_checkpoint: bool = False,
        calibration_batches: int = 4,
        forward_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
        *,
        settings: Settings | None = None,
        log_saturation: bool = False,
        alignment_warn_below: float = ALIGNMENT_WARN_BELOW,
        ratio_warn_below: float = RATIO_WARN_BELOW,
        **probe_kwargs: Any,
    ) -> None:
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1
        ):
            raise ValueError(
                f"Expected `probe_every_n_steps` to be a positive int (optimizer steps) or None, got {every_n_steps!r}."
            )
        Settings.check_flag("probe_on_checkpoint", on_checkpoint)
        if isinstance(calibration_batches, bool) or not isinstance(calibration_batches, int) or calibration_batches < 1:
            raise ValueError(f"Expected `calibration_batches` to be a positive int, got {calibration_batches!r}.")
        if forward_fn is not None and not callable(forward_fn):
            raise ValueError(
                f"Expected `probe_forward_fn` to be a callable (model, batch) -> Any or None, got "
                f"{short_repr(forward_fn)} ({type(forward_fn).__name__}): pass a function, e.g. "
                "probe_forward_fn=lambda model, batch: model(batch['input_ids']), or None for model(batch[0])."
            )
        set_here = sorted({"step", "source", "forward_fn", "settings"} & set(probe_kwargs))
        if set_here:
            raise TypeError(
                f"Expected no {set_here} among the probe arguments, got them: the live probe sets the step and "
                "the source itself; pass forward_fn as its fourth argument and settings as `settings=`."
            )
        fields = {k: probe_kwargs.pop(k) for k in list(probe_kwargs) if k in Settings.names()}
        unknown = sorted(set(probe_kwargs) - set(OWN_OPTIONS))
        if unknown:
            raise TypeError(
                f"Expected probe arguments among {sorted(OWN_OPTIONS)} or satmon.Settings fields, got {unknown}."
            )
        check_options(**probe_kwargs)
        self.settings = settings_from(settings, fields, owner="LiveProbe", own=OWN_OPTIONS)
        self.every_n_steps, self.on_checkpoint = every_n_steps, on_checkpoint
        self.calibration_batches = calibration_batches
        self.forward_fn = forward_fn if forward_fn is not None else feed_first
        self.log_saturation = log_saturation
        self.alignment_warn_below, self.ratio_warn_below = float(alignment_warn_below), float(ratio_warn_below)
        self.probe_kwargs = probe_kwargs
        self.batches: list[Any] = []
        self.saved_to: str | None = None  # where the calibration set was saved (rank zero, with a logger)
        self.reports: list[tuple[int, ProbeReport]] = []
        self._last_step: int | None = None
        self._warned: set[str] = set()
        self._invariance_held = False  # every block's ratio >= ratio_warn_below at some probe of this run

    @property
    def active(self) -> bool:
        """Whether anything triggers a probe."""
        return self.every_n_steps is not None or self.on_checkpoint

    # ----------------------------------------------------------------------------- calibration
    def capture(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Take the calibration batches from ``trainer.train_dataloader`` (once; later calls keep the first set)."""
        if self.batches:
            return
        source = trainer.train_dataloader
        if source is None:
            rank_zero_warn("satmon: no training dataloader to take calibration batches from; the live probe is off.")
            return
        with torch.random.fork_rng(devices=[]):  # a fresh iterator draws seeds from the global RNG
            self.batches = capture_batches(_batches(source), self.calibration_batches)
        if len(self.batches) < self.calibration_batches:
            rank_zero_warn(
                f"satmon: the training loader gave {len(self.batches)} of the {self.calibration_batches} "
                "calibration batches asked for; the live probe uses those."
            )
        self._save_batches(trainer)

    def _save_batches(self, trainer: pl.Trainer) -> None:
        """Save the calibration set beside the logs (rank zero), so ``satmon replay --data`` reads the same batches."""
        log_dir = trainer.log_dir if trainer.loggers else None
        if trainer.global_rank != 0 or not log_dir or not self.batches:
            return
        os.makedirs(log_dir, exist_ok=True)
        self.saved_to = os.path.join(log_dir, CALIBRATION_FILE)
        torch.save(self.batches, self.saved_to)

    # ------------------------------------------------------------------------------------ runs
    def maybe_run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> ProbeReport | None:
        """Run when ``global_step`` is a multiple of ``every_n_steps`` and was not probed yet."""
        step = trainer.global_step
        if self.every_n_steps is None or step % self.every_n_steps:
            return None
        return self.run_once(trainer, pl_module)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> ProbeReport | None:
        """Run for a checkpoint save when ``on_checkpoint`` is set (not twice for one step)."""
        return self.run_once(trainer, pl_module) if self.on_checkpoint else None

    def run_once(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> ProbeReport | None:
        """:meth:`run` at the current global step unless that step was probed already."""
        step = trainer.global_step
        if step == self._last_step or not self.batches:
            return None
        return self.run(trainer, pl_module, step)

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> ProbeReport:
        """Probe ``pl_module`` on the calibration batches (its verdict stamped at ``step``), log the scalars at
        ``step`` (rank zero), warn."""
        self._last_step = step
        report = probe(
            pl_module, self.batches, settings=self.settings, forward_fn=self.forward_fn, step=step, **self.probe_kwargs
        )
        self.reports.append((step, report))
        if trainer.is_global_zero:
            log_scalars(LightningSink(trainer.loggers), probe_scalars(report, saturation=self.log_saturation), step)
        self._warn(report, step)
        return report

    def _warn(self, report: ProbeReport, step: int) -> None:
        if "alignment" not in self._warned:
            aligned = [
                (n, l.kernel_alignment())
                for n, l in report.layers.items()
                if l.kind == "layernorm" and l.alignment is not None
            ]
            low = [(n, a) for n, a in aligned if a < self.alignment_warn_below]
            if low:
                self._warned.add("alignment")
                rank_zero_warn(
                    f"satmon: at step {step} LayerNorm {low[0][0]!r} has dead-direction alignment {low[0][1]:.4f} < "
                    f"{self.alignment_warn_below:g}"
                    + (f" (and {len(low) - 1} more layer(s))" if len(low) > 1 else "")
                    + ": gamma^-1 no longer spans the kernel of its output covariance, which holds exactly for a"
                    " LayerNorm in float32. Check the forward dtype and the layer's outputs (satmon/deadir/...).",
                )
        s = report.sigma_min
        if not s.valid:
            return
        below = [(b, r) for b, r in zip(s.blocks[1:], s.ratios[1:]) if r < self.ratio_warn_below]
        held_before = self._invariance_held
        self._invariance_held = held_before or not below
        severe = [b for b, r in below if r < SEVERE_RATIO]
        if step < 1 or "sigma_min" in self._warned or not below or not (held_before or severe):
            return
        self._warned.add("sigma_min")
        why = "after it held at an earlier probe" if held_before else f"by more than {1 / SEVERE_RATIO:g}x"
        rank_zero_warn(
            f"satmon: at step {step} the residual stream's sigma_min ratio drops to {s.min_ratio:.4f} < "
            f"{self.ratio_warn_below:g} ({why}) at block {s.argmin!r} (below at: {', '.join(b for b, _ in below)}): a "
            "block's update anti-aligns with the stream, the dead-direction paper's anomaly signal "
            "(satmon/sigma_min/ratio/...)."
        )


def _batches(source: Any):
    """Batches as ``training_step`` gets them: one loader directly, several through a CombinedLoader."""
    if isinstance(source, (list, tuple, dict)):
        for batch, _, _ in CombinedLoader(source, "max_size_cycle"):
            yield batch
        return
    if isinstance(source, DataLoader) and source.persistent_workers and source.num_workers > 0:
        source = copy.copy(source)  # iter() of a persistent loader would reset the iterator training reads
        source._iterator = None
    yield from source
