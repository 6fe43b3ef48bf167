"""satmon for the Hugging Face ``Trainer``: a ``TrainerCallback`` that drives :class:`satmon.Screen`.

    trainer = Trainer(model, args, train_dataset=..., callbacks=[SatmonTrainerCallback(window=500)])

What it maps (see ``docs/guides/integrations.md``):

- **Steps.** The ``Trainer`` calls ``on_step_end`` after ``optimizer.step()``, so inputs are counted
  in the forward hooks (``keep_inputs=False``), never after the step. Forwards between
  ``on_step_end`` and the next ``on_step_begin`` (evaluation, ``eval_on_start``) are not counted.
- **Loss.** The loss satmon keeps beside the verdict (and the collapse watch's spike check) is the
  ``loss`` of the model's training outputs (``outputs.loss`` / ``outputs["loss"]``), one per micro-batch.
- **Where the verdict goes: ``report_to``.** satmon reports through the integrations the Trainer
  reports to (``args.report_to``): ``tensorboard``: into Hugging Face's own TensorBoard run
  (``TENSORBOARD_LOGGING_DIR``, ``args.logging_dir`` on transformers 4, else the run folder its
  ``TensorBoardCallback`` opened under ``<output_dir>/runs`` at train start); ``wandb``: the W&B run
  its ``WandbCallback`` opened (scalars, the decision in the config, the card as a table);
  ``mlflow``: the MLflow run its ``MLflowCallback`` opened (metrics, params, the card as the artifact
  ``satmon_verdict.md``); any other integration: the card as ``<output_dir>/satmon_verdict.md``.
  With no integration (``report_to="none"``, transformers 5's default) satmon writes a TensorBoard
  run of its own, ``<output_dir>/runs/satmon``. ``logdir=`` puts satmon's TensorBoard run there instead
  (beside the other integrations). Written on the world's process zero only; one console line at the
  verdict names where the card went.
- **log_history.** At the verdict (the window's end, or a window cut short at train end), every
  process appends one entry to ``state.log_history`` (:func:`log_entry`: ``satmon/decision``,
  ``satmon/trust``, ``satmon/saturation``, ``satmon/threshold``, ``satmon/margin``, ..., ``step``), so it is
  in ``trainer.state.log_history`` and in the ``trainer_state.json`` of the checkpoints saved after it.
- **Stopping.** When the abort policy fires, ``control.should_training_stop`` is set on every
  process: the ranks agree through ``torch.distributed`` when it is initialised (as it is under
  ``torchrun`` / ``accelerate launch``).
- **Resume.** ``on_save`` writes the screen's state (counts summed over ranks) to
  ``satmon_state.pt`` in the checkpoint folder; ``train(resume_from_checkpoint=...)`` reads it back
  (``torch.load(weights_only=True)``) from ``<output_dir>/checkpoint-<global step>``, or from
  ``resume_from`` when the checkpoint lives elsewhere.
"""

from __future__ import annotations

import os
import time
import warnings
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from satmon.drivers.counting import optimizer_name, planned_tokens, put_scale_note, run_scale, scale_note
from satmon.io.sink import Sink
from satmon.io.tags import TAG
from satmon.io.tensorboard import verdict_hparams
from satmon.model.map import model_map
from satmon.results.card import plain
from satmon.results.forecast import run_forecast
from satmon.results.stop import StopRecord
from satmon.results.verdict import Verdict
from satmon.screen.agreement import TorchDistributed
from satmon.screen.screen import Screen
from satmon.settings import ReadsSettings, Settings, settings_from, short_repr

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError(
        f"Expected `transformers` to be installed for satmon.drivers.hf, got {err}. "
        "Install it with `pip install transformers accelerate` (or `pip install -e '.[hf]'` in satmon's clone)."
    ) from err

__all__ = ["SatmonTrainerCallback", "STATE_FILE", "log_entry"]

#: the file, in each checkpoint folder, that holds the screen's state
from satmon.paths import STATE_FILE  # noqa: E402

_ON_MISSING = ("warn", "raise")
_OWN = ("logdir", "resume_from", "on_missing", "verbose", "log_every_n_steps")
#: report_to names that are no tracker satmon can write to (they measure, they do not log a run)
_NOT_TRACKERS = ("codecarbon",)


def _feed(model: nn.Module, batch: tuple[tuple, dict]) -> Any:
    args, kwargs = batch
    return model(*args, **kwargs)


def _loss_of(output: Any) -> torch.Tensor | None:
    """The ``loss`` of a model output (``ModelOutput`` or dict); ``None`` when there is none."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def log_entry(verdict: Verdict, epoch: float | None = None) -> dict[str, Any]:
    """The verdict as the entry the callback appends to the Trainer's ``state.log_history`` at the verdict.

    The keys of the verdict's hyper-parameters (:func:`satmon.io.tensorboard.verdict_hparams`: the decision, its
    trust and source as strings, the window, whether it was cut short, the threshold and level), the pooled
    saturation and the margin as floats, then ``epoch`` and ``step`` as the Trainer's own entries have them.

    Example:
        >>> from satmon.results.verdict import build_verdict
        >>> entry = log_entry(build_verdict({"ln_f": (1, 4)}, step=20, window=20), epoch=0.5)
        >>> [entry[k] for k in ("satmon/decision", "satmon/trust", "satmon/saturation", "satmon/margin", "step")]
        ['no-go', 'unproven', 0.25, -0.18, 20]
    """
    entry: dict[str, Any] = dict(verdict_hparams(verdict))
    entry.update({TAG.hp_saturation: float(verdict.saturation), TAG.hp_margin: float(verdict.margin)})
    if epoch is not None:
        entry["epoch"] = float(epoch)
    entry["step"] = int(verdict.step)
    return entry


class SatmonTrainerCallback(ReadsSettings, TrainerCallback):
    """Screen a DyT model trained by a Hugging Face ``Trainer`` and give the GO / NO-GO verdict.

    The same counts, verdict, collapse watch and abort policy as :class:`satmon.SaturationMonitor`
    (both drive :class:`satmon.Screen`); the verdict is in :attr:`verdict` after training. What GO and NO-GO
    say and are worth: :data:`satmon.study.MEANING`, :data:`satmon.study.WORTH`.

    Args:
        settings: the rule, the window, the watch and the abort policy (a :class:`satmon.Settings`);
            ``None``: built from ``**options``.
        logdir: a TensorBoard directory for satmon's card and scalars, beside the ``report_to`` integrations
            (default: none; the module docstring says where the verdict goes).
        resume_from: the checkpoint folder to read ``satmon_state.pt`` from on a resume (default:
            ``<output_dir>/checkpoint-<global step>``, where ``resume_from_checkpoint=True`` finds it).
        on_missing: a model without DyT layers: ``"warn"`` (train unscreened) or ``"raise"``.
        verbose: when the verdict is made, print its plain-text card (process zero, once); by default one line
            (decision, trust, saturation vs threshold, where the card went). :meth:`card` gives the card later, or
            why there is no verdict.
        log_every_n_steps: running saturation is logged every this many steps (default: ``args.logging_steps``).
        **options: the :class:`satmon.Settings` fields, as documented in :class:`satmon.SaturationMonitor`
            (``window``, ``threshold``, ``calibration``, ``level``, ``product``, ``abort_on``, ``abort_mode``,
            ``dry_run``, ``include``, ``exclude``, ``watch_every_n_steps``, ``watch_from``, ...); not together with
            ``settings``.

    Example:
        >>> cb = SatmonTrainerCallback(window=200, abort_on="no-go")
        >>> cb.settings.window, cb.settings.abort_on, cb.verdict is None
        (200, 'no-go', True)
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        logdir: str | None = None,
        resume_from: str | os.PathLike | None = None,
        on_missing: str = "warn",
        verbose: bool = False,
        log_every_n_steps: int | None = None,
        **options: Any,
    ) -> None:
        self.settings = settings_from(settings, options, owner="SatmonTrainerCallback", own=_OWN)
        if on_missing not in _ON_MISSING:
            raise ValueError(f"Expected `on_missing` in {_ON_MISSING}, got {short_repr(on_missing)}.")
        if log_every_n_steps is not None and (
            isinstance(log_every_n_steps, bool) or not isinstance(log_every_n_steps, int) or log_every_n_steps <= 0
        ):
            raise ValueError(
                f"Expected `log_every_n_steps` to be a positive int or None, got {short_repr(log_every_n_steps)}."
            )
        for name, value in (("logdir", logdir), ("resume_from", resume_from)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(
                    f"Expected `{name}` to be a folder path or None, got {short_repr(value)} ({type(value).__name__})."
                )
        self.logdir, self.resume_from, self.on_missing = logdir, resume_from, on_missing
        self.verbose = Settings.check_flag("verbose", verbose)
        self.log_every_n_steps = log_every_n_steps
        self.screen: Screen | None = None
        self._losses: list[torch.Tensor] = []
        self._hooks: list[Any] = []  # on the model: attach at the first training forward; keep each training loss
        self._step = 0
        self._scale_note = ""  # the card's phase-diagram line, made at train begin
        self._forecast: Any = None  # the card's forecast from the planned passes, made at train begin
        self._paused = ExitStack()  # between steps: evaluation forwards are not training forwards
        self._made = time.time()  # Hugging Face's TensorBoard run is a folder made after this (at train start)

    @property
    def verdict(self) -> Verdict | None:
        """The verdict (``None`` before the window closes, or for a model without DyT: :meth:`card` says why)."""
        return self.screen.verdict if self.screen is not None else None

    def card(self, markdown: bool = False) -> str:
        """The verdict's card in plain text (``markdown``: as TensorBoard shows it), or why there is none.

        Example:
            >>> print(SatmonTrainerCallback(window=10).card())
            satmon: no verdict
            <BLANKLINE>
            training has not started: the screen is made at the Trainer's on_train_begin.
        """
        if self.screen is None:
            text = (
                "### satmon: no verdict\n\ntraining has not started: the screen is made at the "
                "Trainer's on_train_begin."
            )
            return text if markdown else plain(text)
        return self.screen.card(markdown)

    @property
    def stop(self) -> StopRecord | None:
        return self.screen.stop if self.screen is not None else None

    # ------------------------------------------------------------------------------- begin / end
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        if model is None:
            raise ValueError("Expected the Trainer to pass `model` to on_train_begin, got None.")
        steps = self.log_every_n_steps or (int(args.logging_steps) if args.logging_steps >= 1 else 50)
        logdir, sink = self._destinations(args) if state.is_world_process_zero else (None, None)
        self.screen = Screen(
            self.settings,
            sink=sink,
            logdir=logdir,
            agreement=TorchDistributed(),
            verbose=self.verbose,
            log_every_n_steps=steps,
        )
        self._step = state.global_step
        if not model_map(model).layers(("dyt",), include=self.settings.include, exclude=self.settings.exclude):
            self._no_dyt(model)
            return
        if state.global_step > 0:
            self._load(args, state)
        self._scale_note = scale_note(model, kwargs.get("train_dataloader"), self.settings.unique_tokens)
        loader = kwargs.get("train_dataloader")  # its batch size is the per-device one
        counted = planned_tokens(
            state.max_steps,
            getattr(loader, "batch_size", None) or args.per_device_train_batch_size,
            loader,
            args.gradient_accumulation_steps,
            args.world_size,
        )
        s = self.settings
        scale = run_scale(model, loader, s.unique_tokens)
        planned, how = (s.planned_tokens, "given: planned_tokens=") if s.planned_tokens is not None else counted
        self._forecast = run_forecast(
            scale.params,
            scale.unique_tokens,
            planned,
            scale.missing,
            how,
            s.planned_steps or (state.max_steps if state.max_steps and state.max_steps > 0 else None),
            s.warmup_steps,
            s.lr_schedule,
            optimizer=optimizer_name(kwargs.get("optimizer")),
        )
        # the hooks go on at the first training forward, whose batch the gated-MLP trace
        # reads (as the Lightning callback)
        self._hooks = [
            model.register_forward_pre_hook(self._attach, with_kwargs=True, prepend=True),
            model.register_forward_hook(self._keep_loss),
        ]

    def _attach(self, model: nn.Module, args: tuple, kwargs: dict) -> None:
        if not model.training:  # evaluation before training (eval_on_start)
            return
        self._hooks.pop(0).remove()
        assert self.screen is not None
        # counted in the hooks (keep_inputs=False): on_step_end comes after optimizer.step(), too late for kept inputs
        self.screen.attach(model, step=self._step, keep_inputs=False, example_input=(args, kwargs), forward_fn=_feed)
        put_scale_note(self.screen.notes, self._scale_note)  # after attach: a resume restores the saved notes there
        self.screen.forecast = self._forecast

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.screen is None or not self.screen.active:
            return
        self._paused.close()
        before = self.screen.verdict
        self.screen.finish(state.global_step)
        self._log_verdict(state, before)
        self.screen.detach()  # also closes the screen's TensorBoard files before train() returns

    # ------------------------------------------------------------------------------------ per step
    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step = state.global_step
        if self.screen is None or not self.screen.active:
            return
        self._paused.close()
        self.screen.begin_step(state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.screen is None or not self.screen.active:
            return
        losses, self._losses = self._losses, []
        for loss in losses[:-1]:  # earlier micro-batches of this optimizer step
            self.screen.push_loss(loss)
        before = self.screen.verdict
        self.screen.end_step(state.global_step, losses[-1] if losses else None)
        self._log_verdict(state, before)
        if self.screen.should_stop:  # agreed by every rank inside the screen
            control.should_training_stop = True
        self._paused.enter_context(self.screen.paused())

    def _keep_loss(self, module: nn.Module, args: Any, output: Any) -> None:
        loss = _loss_of(output) if module.training else None
        if loss is not None:
            self._losses.append(loss.detach())

    def _log_verdict(self, state: TrainerState, before: Verdict | None) -> None:
        """A verdict made by this step (or the window's end): one entry in ``state.log_history``, on every process."""
        verdict = self.verdict
        if verdict is not None and verdict is not before:
            state.log_history.append(log_entry(verdict, state.epoch))

    # --------------------------------------------------------------------------------------- state
    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.screen is None or not self.screen.active:
            return
        saved = self.screen.state_dict(sync=True)  # every process: the counts are summed over ranks
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(folder, exist_ok=True)
            torch.save(saved, os.path.join(folder, STATE_FILE))

    def _load(self, args: TrainingArguments, state: TrainerState) -> None:
        """On a resume: rank zero reads the saved state and every rank takes the same copy."""
        assert self.screen is not None
        folder = self.resume_from or os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        path = os.path.join(folder, STATE_FILE)
        saved = torch.load(path, weights_only=True) if os.path.isfile(path) else None
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            box = [saved]
            dist.broadcast_object_list(box, src=0)
            saved = box[0]
        if saved is None:
            self.screen.warn(
                f"satmon: resumed at step {state.global_step} without a saved screen ({path} not found): the "
                "window counts from here, so the verdict covers the steps after the resume only. Pass "
                "`resume_from=` the checkpoint folder when it is not under the Trainer's output_dir."
            )
            self.screen.first_step = self.screen.steps_seen = state.global_step
            return
        self.screen.load_state_dict(saved)

    # ------------------------------------------------------------------------------------ helpers
    def _destinations(self, args: TrainingArguments) -> tuple[str | None, Sink | None]:
        """Where the readings go: a TensorBoard folder (the screen's own sink) and the other ``report_to`` trackers."""
        from satmon.io.sink import MultiSink
        from satmon.io.trackers import MarkdownFileSink, MlflowSink, WandbSink

        names = [n for n in (args.report_to or []) if n not in ("none", *_NOT_TRACKERS)]
        logdir = os.fspath(self.logdir) if self.logdir is not None else None
        sinks: list[Sink] = []
        for name in names:
            if name == "tensorboard":
                logdir = logdir or self._hf_tensorboard_dir(args)
            elif name == "wandb":
                import wandb

                if wandb.run is not None:
                    sinks.append(WandbSink(wandb.run))
                else:
                    self._say_missing("wandb", "no W&B run is open (wandb.run is None)")
            elif name == "mlflow":
                import mlflow

                run = mlflow.active_run()
                if run is not None:
                    sinks.append(MlflowSink(run.info.run_id))
                else:
                    self._say_missing("mlflow", "no MLflow run is active")
            elif not any(isinstance(s, MarkdownFileSink) for s in sinks):
                # a tracker satmon has no writer for: the card as a file
                sinks.append(MarkdownFileSink(args.output_dir))
        if not names and logdir is None:
            # no integration: a TensorBoard run of satmon's own
            logdir = os.path.join(args.output_dir, "runs", "satmon")
        sink = None if not sinks else sinks[0] if len(sinks) == 1 else MultiSink(*sinks)
        return logdir, sink

    def _hf_tensorboard_dir(self, args: TrainingArguments) -> str:
        """Hugging Face's TensorBoard run: its environment variable, transformers 4's ``logging_dir``, else the newest
        run folder its ``TensorBoardCallback`` made under ``<output_dir>/runs`` since this callback was made."""
        given = os.getenv("TENSORBOARD_LOGGING_DIR") or getattr(args, "logging_dir", None)
        if given:
            return os.path.expanduser(given)
        runs = os.path.join(args.output_dir, "runs")
        made = []
        for name in os.listdir(runs) if os.path.isdir(runs) else []:
            folder = os.path.join(runs, name)
            events = (
                [f for f in os.listdir(folder) if f.startswith("events.out.tfevents.")] if os.path.isdir(folder) else []
            )
            if events and name != "satmon" and os.path.getmtime(folder) >= self._made - 1:
                made.append((os.path.getmtime(folder), folder))
        # beside it: tensorboard --logdir <output_dir>/runs
        return max(made)[1] if made else os.path.join(runs, "satmon")

    def _say_missing(self, name: str, why: str) -> None:
        warnings.warn(
            f"satmon: report_to names {name!r}, but {why}: satmon's verdict does not go there (the console "
            "line says where it went). List SatmonTrainerCallback after the Trainer's own callbacks (the "
            "default: Trainer(callbacks=[...]) adds them after the integrations).",
            UserWarning,
            stacklevel=3,
        )

    def _no_dyt(self, model: nn.Module) -> None:
        msg = (
            f"satmon found no DyT layer in {type(model).__name__}, so the saturation screen is off (no verdict). "
            "Convert the norms with `satmon.convert_to_dyt(model)` before training, or point satmon at your DyT "
            "layers with `include=`."
        )
        assert self.screen is not None  # made by on_train_begin, the only caller
        self.screen.status = msg
        if self.on_missing == "raise":
            raise ValueError(msg + " (on_missing='raise')")
        warnings.warn(msg, UserWarning, stacklevel=2)
