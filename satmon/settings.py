"""``Settings``: every option of the rule, the window, the watch and the abort policy, validated once and
passed whole.

One frozen object is built once (by the user, or by a driver from its keyword options) and handed, the
same object, to :class:`satmon.Screen`, the live probe, :func:`satmon.probe` and ``satmon replay``: no
consumer restates or re-checks an option, so none can drop one. Its parts:

- **the rule**: ``threshold``, ``level``, ``collapse_threshold``, ``product``, and where the threshold comes
  from: ``caveat`` (the card's provenance line) or ``calibration`` (a ``calibration.json`` of ``satmon
  calibrate``, whose threshold and provenance both apply);
- **the window**: ``window``, ``sample_every``, ``offset_every``, ``include`` / ``exclude``, ``gating_mapping``;
- **the watch**: ``watch_every_n_steps``, ``watch_from`` (default: the warm-up's end, else the window's end:
  :attr:`Settings.watch_start`), ``patience``, ``loss_spike_z``, ``loss_baseline``; the trap watch:
  ``trap_every_n_steps``, ``trap_patience``, ``trap_floor``;
- **the abort policy**: ``abort_on``, ``abort_mode``, ``dry_run``;
- **the run**: ``unique_tokens``, the unique tokens the run trains on (``train_tokens``, its old name, is
  deprecated), when satmon cannot count them from the
  training data (the card places the run on the study's phase diagram with it), and ``planned_tokens``, the
  tokens training will process (optimizer steps x global batch x sequence length), when satmon cannot count
  them from the trainer: the card's forecast from the planned passes (:func:`satmon.forecast`) divides the
  second by the first; ``planned_steps`` (default: the trainer's), ``warmup_steps`` and ``lr_schedule``, the
  run's schedule, which the forecast's domain compares with what its cells trained; ``final_norm``, the kind of the
  norm before the head (``"dyt"`` or ``"norm"``), where satmon cannot read it from the model's forward (a compiled
  model): what the model computes, when read, wins.

Defaults are the study's (:mod:`satmon.study`). ``threshold=None`` and ``caveat=None`` mean "the study's,
or the calibration's"; both are kept as given. The rule in force, made from them once, is ``settings.rule``
(:class:`~satmon.results.rule.Rule`): ``settings.rule.threshold`` is always the number the verdict compares with.
"""

from __future__ import annotations

import dataclasses  # noqa: F401 - the doctests' replace
import functools
import inspect
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from satmon import study
from satmon._compat import deprecated
from satmon.functional.saturation import check_product
from satmon.results.calibration import (  # short_repr: re-exported
    Calibration,
    CalibrationError,
    load_calibration,
    short_repr,
)
from satmon.results.forecast.cells import final_norm_of
from satmon.results.rule import Rule
from satmon.results.stop import ABORT_MODES, ABORT_ON

__all__ = ["MAX_KEPT_STEPS", "ReadsSettings", "Settings", "check_rule", "check_selector", "settings_from", "short_repr"]


def _fraction(name: str, value: Any, note: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"Expected `{name}` in (0, 1) ({note}), got {value!r}.")
    return float(value)


def _int(name: str, value: Any, low: int, note: str, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else ("positive" if low == 1 else f">= {low}")
        what = "a positive int" if span == "positive" else "an int " + span
        raise ValueError(f"Expected `{name}` to be {what} ({note}), got {value!r}.")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"Expected `{name}` to be True or False, got {value!r} ({type(value).__name__}).")
    return value


def check_rule(level: Any, threshold: Any, collapse_threshold: Any) -> tuple[float, float, float]:
    """Validate the saturation rule's three numbers.

    Example:
        >>> from satmon import study
        >>> rule = (study.LEVEL, study.THRESHOLD, study.COLLAPSE_THRESHOLD)
        >>> check_rule(*rule) == rule
        True
        >>> check_rule(-1, study.THRESHOLD, study.COLLAPSE_THRESHOLD)
        Traceback (most recent call last):
        ...
        ValueError: Expected `level` > 0 (the per-element cut-off |alpha * x| > level; the study's is 2), got -1.
    """
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not math.isfinite(level) or level <= 0:
        raise ValueError(
            f"Expected `level` > 0 (the per-element cut-off |alpha * x| > level; the study's is "
            f"{study.LEVEL:g}), "
            f"got {level!r}."
        )
    return (
        float(level),
        _fraction("threshold", threshold, f"the GO level of pooled saturation; the study's is {study.THRESHOLD:g}"),
        _fraction("collapse_threshold", collapse_threshold, f"the study's is {study.COLLAPSE_THRESHOLD:g}"),
    )


#: The most steps of training loss the watch keeps on the device (``loss_baseline``, ``watch_every_n_steps``): 8 MB.
MAX_KEPT_STEPS = 1_000_000


def _check_predicate(name: str, value: Callable[..., Any]) -> None:
    """A predicate is called as ``value(module_name, module)``: one that cannot take two arguments is refused now."""
    if isinstance(value, type):
        raise ValueError(
            f"Expected `{name}` to be a predicate (name, module) -> bool, got the class {value.__name__}: "
            f"to select modules by type pass {name}=lambda name, module: "
            f"isinstance(module, {value.__name__})."
        )
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # a builtin without a signature: called as it is
        return
    try:
        signature.bind("layer", None)
    except TypeError:
        raise ValueError(
            f"Expected `{name}` to be a predicate called as {name}(name, module) -> bool, got "
            f"{getattr(value, '__qualname__', type(value).__name__)}{signature}, which cannot take those "
            "two "
            f"arguments: e.g. {name}=lambda name, module: name.endswith('norm')."
        ) from None


def check_selector(name: str, value: Any) -> None:
    """``include`` / ``exclude``: ``None``, a regex string, or a predicate ``(name, module) -> bool``.

    Example:
        >>> check_selector("include", r"\\.norm$") is None
        True
        >>> check_selector("include", lambda module: True)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        ValueError: Expected `include` to be a predicate called as include(name, module) -> bool, got
        <lambda>(module), which cannot take those two arguments: e.g. include=lambda name, module:
        name.endswith('norm').
    """
    if value is None:
        return
    if callable(value):
        _check_predicate(name, value)
        return
    if not isinstance(value, str):
        raise ValueError(
            f"Expected `{name}` to be None, a regex on module names or a predicate (name, module) -> "
            "bool, "
            f"got {short_repr(value)} ({type(value).__name__})."
        )
    try:
        re.compile(value)
    except re.error as e:
        raise ValueError(f"Expected `{name}` to be a valid regular expression, got {value!r}: {e}.") from e


def _gating_mapping(value: Any) -> dict[str, str | None] | None:
    """``{dyt_layer_name: gated_mlp_module_name or None}`` (``None``: the layer feeds no gated MLP), copied."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(
            "Expected `gating_mapping` to be a dict {dyt_layer_name: gated_mlp_module_name or None}, "
            f"got {type(value).__name__}: e.g. gating_mapping={{'blocks.0.norm_2': 'blocks.0.mlp'}}."
        )
    for key, mlp in value.items():
        if not isinstance(key, str):
            raise ValueError(
                f"Expected the keys of `gating_mapping` to be DyT layer names (str), got "
                f"{short_repr(key)} "
                f"({type(key).__name__}): name the layer as model.named_modules() does, e.g. "
                "'blocks.0.norm_2'."
            )
        if mlp is not None and not isinstance(mlp, str):
            raise ValueError(
                f"Expected `gating_mapping[{key!r}]` to be the name of the gated MLP module it feeds "
                "(str) or "
                f"None (it feeds none), got {short_repr(mlp)} ({type(mlp).__name__}): e.g. "
                f"{{{short_repr(key)}: 'blocks.0.mlp'}}."
            )
    return dict(value)


def _calibration(value: Any) -> Calibration | None:
    """A :class:`Calibration` of the pooled saturation, read from a path when given one."""
    if value is None:
        return None
    if isinstance(value, Calibration):
        cal = value
    elif isinstance(value, (str, os.PathLike)):
        cal = load_calibration(value)
    else:
        raise CalibrationError(
            f"Expected a path to a calibration.json or a Calibration, got {short_repr(value)} "
            f"({type(value).__name__}) for `calibration`: pass the file `satmon calibrate` wrote "
            "(calibration='OUT/calibration.json')."
        )
    if cal.metric != "saturation":
        raise CalibrationError(
            f"Expected a calibration of the pooled saturation (metric 'saturation'), got metric "
            f"{cal.metric!r} from {cal.path or short_repr(value)}: the verdict's rule reads the "
            "pooled "
            "saturation; calibrate with `--metric saturation`."
        )
    return cal


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting of the rule, the window, the watch and the abort policy, checked when made.

    Build it once and pass it whole (``Screen(settings)``, ``SaturationMonitor(settings=...)``,
    ``probe(model, batches, settings=...)``, ``replay(..., settings=...)``); a variant is
    ``dataclasses.replace(settings, window=100)``. Each field is documented in
    :class:`satmon.SaturationMonitor`.

    The rule's threshold comes from one place: ``threshold=None`` (the default) means the study's
    (:data:`satmon.study.THRESHOLD`) or, with ``calibration=``, the calibration's; ``caveat=None``
    the matching provenance line for the card. A ``threshold`` or ``caveat`` that differs from the
    calibration's is refused (give one source of the threshold). ``threshold`` and ``caveat`` are kept as
    given; ``calibration`` holds the :class:`Calibration` read (from a path, once).

    ``rule`` is the one :class:`~satmon.results.rule.Rule` every consumer judges readings by (the screen,
    ``probe``, the replay): computed here from what was given (:meth:`Rule.resolve
    <satmon.results.rule.Rule.resolve>`), not an option; whose threshold it is is decided by what was given,
    never by comparing numbers: ``calibration=`` -> ``"calibration"``; no ``threshold`` and no caveat of one's
    own -> ``"study"``; a ``threshold`` given -> ``"user"``, even the study's number (leave it out for the
    study's rule and its held-out figures). ``dataclasses.replace`` computes it again from the fields it carries.

    Example:
        >>> from satmon import study
        >>> s = Settings(window=100)
        >>> s.window, s.threshold, s.rule.threshold == study.THRESHOLD, s.rule.threshold_source
        (100, None, True, 'study')
        >>> Settings(threshold=0.5).rule.threshold_source, dataclasses.replace(s, window=9).rule.threshold_source
        ('user', 'study')
        >>> Settings(dry_run="yes")
        Traceback (most recent call last):
        ...
        ValueError: Expected `dry_run` to be True or False, got 'yes' (str).
    """

    # the rule
    threshold: float | None = None
    level: float = study.LEVEL
    collapse_threshold: float = study.COLLAPSE_THRESHOLD
    product: str = "module"
    caveat: str | None = None  # the card's provenance line; None: the study's, or the calibration's
    calibration: Calibration | str | os.PathLike | None = None
    #: the one rule every verdict is judged by, computed from the options above (not an option itself)
    rule: Rule = field(init=False)
    # the window
    window: int = 500
    sample_every: int = 1
    offset_every: int = 10
    include: str | Callable[[str, Any], bool] | None = None
    exclude: str | Callable[[str, Any], bool] | None = None
    gating_mapping: Mapping[str, str | None] | None = field(default=None, hash=False)
    # the watch
    watch_every_n_steps: int = 50
    watch_from: int | None = None  # the collapse watch's first step; None: Settings.watch_start says
    patience: int = 1
    loss_spike_z: float = 8.0
    loss_baseline: int = 200
    # the trap watch (from step 1)
    trap_every_n_steps: int = 10
    trap_patience: int = 3
    trap_floor: float = 0.0
    # the abort policy
    abort_on: str = "never"
    abort_mode: str = "graceful"
    dry_run: bool = False
    # the run
    unique_tokens: int | None = None
    planned_tokens: int | None = None
    planned_steps: int | None = None
    warmup_steps: int | None = None
    lr_schedule: str | None = None
    final_norm: str | None = None

    def __post_init__(self) -> None:
        cal = _calibration(self.calibration)
        threshold, caveat = self.threshold, self.caveat
        if caveat is not None and not isinstance(caveat, str):
            raise ValueError(
                f"Expected `caveat` to be a str (the card's provenance line) or None, got "
                f"{short_repr(caveat)} "
                f"({type(caveat).__name__})."
            )
        if cal is not None:
            for name, given, own in (("threshold", threshold, cal.threshold), ("caveat", caveat, cal.caveat())):
                if given not in (None, "") and given != own:  # its own value (a dataclasses.replace) is no clash
                    raise ValueError(
                        f"Expected either `{name}` or `calibration`, got both ({name}="
                        f"{short_repr(given)}, "
                        f"calibration={cal.path or 'a Calibration'!r} with threshold "
                        f"{cal.threshold:.4g}): the "
                        f"calibration holds its own threshold and provenance; drop `{name}` (or the "
                        "calibration)."
                    )
        in_force = threshold if threshold is not None else cal.threshold if cal is not None else study.THRESHOLD
        level, _, collapse = check_rule(self.level, in_force, self.collapse_threshold)
        rule = Rule.resolve(
            threshold=None if threshold is None else float(threshold),
            caveat=caveat or None,
            calibration=cal,
            collapse_threshold=collapse,
        )
        for name, value in (
            ("calibration", cal),
            ("level", level),
            ("collapse_threshold", collapse),
            ("rule", rule),
            ("gating_mapping", _gating_mapping(self.gating_mapping)),
        ):
            object.__setattr__(self, name, value)
        check_product(self.product)
        _int("window", self.window, 1, "optimizer steps")
        _int("sample_every", self.sample_every, 1, "count every k-th step of the window", high=self.window)
        _int(
            "offset_every",
            self.offset_every,
            0,
            "offset statistics on every k-th counted window step; 0 turns them off",
        )
        check_selector("include", self.include)
        check_selector("exclude", self.exclude)
        _int("watch_every_n_steps", self.watch_every_n_steps, 0, "0 turns the watch off", high=MAX_KEPT_STEPS)
        if self.watch_from is not None:
            _int(
                "watch_from",
                self.watch_from,
                1,
                "the optimizer step the collapse watch starts at, during the window too; or None: the warm-up's "
                "end (warmup_steps) when given and not 0, else the window's end",
            )
        _int("patience", self.patience, 1, "consecutive breaching checks")
        _int(
            "trap_every_n_steps",
            self.trap_every_n_steps,
            0,
            "read the trap on one optimizer step in this many from step 1; 0 turns the trap watch off",
            high=MAX_KEPT_STEPS,
        )
        _int("trap_patience", self.trap_patience, 1, "consecutive checks with the trap's evidence before it is named")
        f = self.trap_floor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f < 1:
            raise ValueError(
                f"Expected `trap_floor` in [0, 1) (the gradient norm below the final norm over the head's at "
                f"or under which it is dead; 0: exactly zero), got {short_repr(f)}."
            )
        object.__setattr__(self, "trap_floor", float(f))
        z = self.loss_spike_z
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z <= 0:
            raise ValueError(f"Expected `loss_spike_z` > 0 (robust sigmas), got {z!r}.")
        object.__setattr__(self, "loss_spike_z", float(z))
        _int(
            "loss_baseline",
            self.loss_baseline,
            2,
            "steps of training loss kept on the device for the spike baseline",
            high=MAX_KEPT_STEPS,
        )
        if self.abort_on not in ABORT_ON:
            raise ValueError(f"Expected `abort_on` in {ABORT_ON}, got {short_repr(self.abort_on)}.")
        if self.abort_mode not in ABORT_MODES:
            raise ValueError(f"Expected `abort_mode` in {ABORT_MODES}, got {short_repr(self.abort_mode)}.")
        _flag("dry_run", self.dry_run)
        if self.unique_tokens is not None:
            _int(
                "unique_tokens",
                self.unique_tokens,
                1,
                "the unique tokens the run trains on; None: counted from the training data when satmon can",
            )
        if self.planned_tokens is not None:
            _int(
                "planned_tokens",
                self.planned_tokens,
                1,
                "the tokens training will process: optimizer steps x global "
                "batch x sequence length; None: counted from the trainer when satmon can",
            )
        if self.planned_steps is not None:
            _int(
                "planned_steps",
                self.planned_steps,
                1,
                "the run's optimizer steps, for the forecast's domain; None: the trainer's when satmon can read them",
            )
        if self.warmup_steps is not None:
            _int(
                "warmup_steps", self.warmup_steps, 0, "the run's learning-rate warm-up steps, for the forecast's domain"
            )
        if self.lr_schedule is not None and (not isinstance(self.lr_schedule, str) or not self.lr_schedule.strip()):
            raise ValueError(
                f"Expected `lr_schedule` as the learning rate's shape, a str such as "
                "'linear-warmup-constant' "
                f"(the study's) or 'linear-warmup-cosine', got {short_repr(self.lr_schedule)}."
            )
        final_norm_of(self.final_norm)  # "Expected final_norm as 'dyt' ... or 'norm' ..., got X" otherwise

    @property
    def watch_start(self) -> int:
        """The optimizer step the collapse watch starts at: its checks measure the steps from here on that are
        multiples of ``watch_every_n_steps`` (during the window too, beside its counting, which they leave as is).

        ``watch_from`` when given, else ``warmup_steps`` when the run's warm-up is given and at least one step, else
        the window's end; never later than the window's end (``watch_from >= window``: the watch starts after the
        window, as it did before ``watch_from`` existed). Why the warm-up's end: started at the warm-up's end, the watch
        led the loss rule in satmon's collapse grid (started after the window, it flagged failing runs no earlier than
        the loss). A start inside the warm-up, or at step 1 of a run without one (``warmup_steps=0``), is unmeasured,
        so a run without a warm-up is watched after the window unless ``watch_from`` says otherwise.

        Example:
            >>> Settings().watch_start, Settings(warmup_steps=100).watch_start, Settings(watch_from=60).watch_start
            (500, 100, 60)
            >>> Settings(window=50, watch_from=60).watch_start, Settings(warmup_steps=0).watch_start
            (50, 500)
            >>> Settings(watch_from=0)
            Traceback (most recent call last):
            ...
            ValueError: Expected `watch_from` to be a positive int (the optimizer step the collapse watch starts at, \
during the window too; or None: the warm-up's end (warmup_steps) when given and not 0, else the window's end), got 0.
        """
        start = self.watch_from if self.watch_from is not None else (self.warmup_steps or None)
        return self.window if start is None else min(start, self.window)

    @property
    def watch_start_text(self) -> str:
        """Where the collapse watch starts, in words: "from step N (the warm-up's end)", "from step N" or "after the
        window".

        Example:
            >>> Settings(warmup_steps=100).watch_start_text, Settings().watch_start_text
            ("from step 100 (the warm-up's end)", 'after the window')
        """
        start = self.watch_start
        if start >= self.window:
            return "after the window"
        warmup = self.watch_from is None and self.warmup_steps is not None
        return f"from step {start}" + (" (the warm-up's end)" if warmup else "")

    @staticmethod
    def names() -> tuple[str, ...]:
        """The option names, in the order of the parts.

        Example:
            >>> Settings.names()[:3]
            ('threshold', 'level', 'collapse_threshold')
        """
        return _NAMES

    @staticmethod
    def check_flag(name: str, value: Any) -> bool:
        """A boolean argument (``verbose=``): ``True``/``False`` only, not ``"no"``."""
        return _flag(name, value)


#: Options that were renamed: old name -> new one (the old keyword and attribute work until satmon 0.6, with a warning).
#: The run's unique training tokens had two names (``train_tokens`` here, ``unique_tokens`` in :func:`satmon.forecast`).
RENAMED: dict[str, str] = {"train_tokens": "unique_tokens"}


def renamed_options(options: Mapping[str, Any], owner: str = "Settings") -> dict[str, Any]:
    """``options`` with each old option name (:data:`RENAMED`) given as its new one, and a deprecation warning.

    Raises:
        ValueError: both the old and the new name were given.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always")
        ...     renamed_options({"train_tokens": 1000})
        {'unique_tokens': 1000}
        >>> print(w[0].message)
        train_tokens= is deprecated since satmon 0.5: use unique_tokens= (the old name works until satmon 0.6).
    """
    from satmon._compat import SatmonDeprecationWarning

    out = dict(options)
    for old, new in RENAMED.items():
        if old in out:
            if new in out:
                raise ValueError(
                    f"Expected one of `{old}` and `{new}` in {owner}, got both: `{old}` is the old name of "
                    f"`{new}`; pass `{new}` only."
                )
            warnings.warn(
                f"{old}= is deprecated since satmon 0.5: use {new}= (the old name works until satmon 0.6).",
                SatmonDeprecationWarning,
                stacklevel=3,
            )
            out[new] = out.pop(old)
    return out


_dataclass_init = Settings.__init__


@functools.wraps(_dataclass_init)
def _settings_init(self: Settings, **options: Any) -> None:
    _dataclass_init(self, **renamed_options(options))


def _train_tokens(self: Settings) -> int | None:
    """Deprecated: :attr:`unique_tokens` (the old name works until satmon 0.6)."""
    from satmon._compat import SatmonDeprecationWarning

    warnings.warn(
        "Settings.train_tokens is deprecated since satmon 0.5: use Settings.unique_tokens (the old name works "
        "until satmon 0.6).",
        SatmonDeprecationWarning,
        stacklevel=2,
    )
    return self.unique_tokens


Settings.__init__ = _settings_init  # type: ignore[method-assign]
Settings.train_tokens = property(_train_tokens)  # type: ignore[attr-defined]
_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Settings) if f.name != "rule")
#: the options whose value in force is the rule's (the option itself is kept as given)
_IN_FORCE = ("threshold", "caveat")


class ReadsSettings:
    """A mixin for what holds a :class:`Settings` in ``self.settings``: read an option as ``obj.settings.window``.

    Deprecated since satmon 0.5: ``obj.window``, ``obj.threshold``... still read the settings (no editor or type
    checker sees them), with a :class:`~satmon._compat.SatmonDeprecationWarning`, until satmon 0.6.

    Example:
        >>> import warnings
        >>> class Holder(ReadsSettings):
        ...     def __init__(self) -> None:
        ...         self.settings = Settings(window=7)
        >>> Holder().settings.window
        7
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     Holder().window
        7
        >>> print(caught[0].message)
        Holder.window is deprecated since satmon 0.5: use Holder.settings.window (the old form works until satmon 0.6).
    """

    def __getattr__(self, name: str) -> Any:
        settings = self.__dict__.get("settings")
        if isinstance(settings, Settings) and name in _NAMES:
            owner, where = type(self).__name__, "rule" if name in _IN_FORCE else ""  # 0.4 read the value in force
            deprecated(f"{owner}.{name}", ".".join(filter(None, (owner, "settings", where, name))))
            return getattr(settings.rule if where else settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def settings_from(
    settings: Any, options: Mapping[str, Any], *, owner: str, own: Iterable[str] = (), hint: str = ""
) -> Settings:
    """The one :class:`Settings` a consumer runs on: ``settings`` as given, or one built from its keyword ``options``.

    Args:
        settings: a :class:`Settings` or ``None``.
        options: keyword options (``window=500, ...``): each must be a :class:`Settings` field.
        owner: who asks (``"SaturationMonitor"``, ``"probe"``), for the messages.
        own: the owner's own keyword arguments, listed in the message for an unknown option.
        hint: a sentence added to that message.

    Raises:
        TypeError: ``settings`` is not a :class:`Settings`, or an option is unknown (the message lists the valid ones).
        ValueError: both ``settings`` and options were given, or an option's value is wrong.

    Example:
        >>> settings_from(None, {"window": 100}, owner="Screen").window
        100
        >>> settings_from(None, {"windw": 100}, owner="Screen")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: Expected Screen options among ['abort_mode', 'abort_on', ...], got ['windw']...
    """
    if settings is not None and not isinstance(settings, Settings):
        raise TypeError(
            f"Expected `settings` to be a satmon.Settings or None, got {short_repr(settings)} "
            f"({type(settings).__name__}): pass the options by keyword ({owner}(window=500, ...)) or build "
            "them once with satmon.Settings(...)."
        )
    valid = Settings.names()
    options = renamed_options(options, owner)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        extra = f" (plus {', '.join(own)})" if own else ""
        raise TypeError(
            f"Expected {owner} options among {sorted(valid)}{extra}, got {unknown}: check the spelling."
            + (f" {hint}" if hint else "")
        )
    if settings is not None and options:
        raise ValueError(
            f"Expected either `settings` or keyword options, got both (options {sorted(options)}): put "
            "them "
            f"in the Settings, e.g. dataclasses.replace(settings, {min(options)}=...)."
        )
    return settings if settings is not None else Settings(**options)
