"""The recipe contract: what a user's code gives ``satmon grid`` for one cell (docs/guides/grid.md).

A recipe is a :class:`Recipe` named on the command line as ``MODULE:ATTR`` or ``path/to/file.py:ATTR``
(loaded by :func:`satmon.replaying.user_code.import_object`, the loader of ``satmon replay --model``: the
working directory is not searched, and naming the code is the opt-in to run it). It holds two functions:

* ``data(spec) -> CellData``: the cell's unique training data cut to ``spec.unique_tokens``, a *fresh*
  seeded stream of training batches each time ``CellData.train()`` is called (both arms draw the same
  batches in the same order), the held-out split, and the sequences the final probe reads;
* ``model(spec, norm) -> torch.nn.Module``: the model with ``norm`` = ``"layernorm"`` or ``"dyt"``, seeded
  from ``spec.seed`` so that both arms start from the same weights (the norms draw no random numbers).

The grid owns the loop (optimizer, schedule, screen, readings: :mod:`satmon.grid.train`), so every cell of
every recipe is measured the same way and both arms are checked to start equal and to see the same batches.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BUILTIN",
    "BUILTINS",
    "NORMS",
    "CellData",
    "CellSpec",
    "Recipe",
    "check_identity",
    "is_dyt_arm",
    "lm_loss",
    "load_recipe",
    "recipe_identity",
    "snapshot_recipe",
]

#: The two arms of a cell by default (a recipe's ``arms``: the first is the reference arm).
NORMS = ("layernorm", "dyt")
#: What ``satmon grid builtin`` names: satmon's faithful grid.
BUILTIN = "satmon.grid.builtin:RECIPE"
#: The built-in recipes by their short names (``satmon grid builtin``, ``satmon grid llama``).
BUILTINS = {"builtin": BUILTIN, "llama": "satmon.grid.builtin_llama:RECIPE"}


def is_dyt_arm(arm: str) -> bool:
    """Whether an arm's name says it holds DyT layers (``"dyt"`` or ``"dyt-..."``): such arms are screened.

    Example:
        >>> is_dyt_arm("dyt"), is_dyt_arm("dyt-gelu"), is_dyt_arm("rmsnorm")
        (True, True, False)
    """
    return arm == "dyt" or arm.startswith("dyt-")


@dataclass(frozen=True)
class CellSpec:
    """One cell as the recipe sees it.

    Attributes:
        size: the size's name as given to ``--sizes`` (the recipe parses it).
        budget: the budget's text (``"164ep"``, ``"31220"``).
        unique_tokens: the unique training tokens the cell trains on.
        seed: the cell's seed (weights and batch order).
        steps: optimizer steps per arm.
        processed_tokens: tokens one arm processes (``steps`` x the recipe's tokens per step).
        options: the recipe's options (its defaults updated by ``--option KEY=VALUE``).
    """

    size: str
    budget: str
    unique_tokens: int
    seed: int
    steps: int
    processed_tokens: int
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CellData:
    """One cell's data, from the recipe's ``data(spec)``.

    Attributes:
        train: called once per arm, returns a fresh iterator of ``(inputs, targets)`` training batches, seeded
            from the cell's seed (the two calls must yield the same batches: the grid checks it).
        val_inputs: held-out inputs, ``(N, ...)``; ``val_targets`` their targets. The held-out loss is the mean
            over ``N`` (batches of ``val_batch``).
        probe: training-split input batches for the final checkpoint's probe (the study reads the training split).
        probe_heldout: held-out input batches for the same probe beside it (``None``: the held-out inputs' first
            ``len(probe)`` batches).
        example_input: a small input batch the screen traces the model with (gating).
        unique_tokens: the cell's unique training tokens as the recipe counted them.
        unigram_loss: the held-out loss of a model that ignores the context, if the recipe can say it
            (``None``: not known; the cell's ``learns_*`` fields are then ``None``).
        val_batch: the batch size of the held-out loss.
    """

    train: Callable[[], Iterator[tuple[Any, Any]]]
    val_inputs: Any
    val_targets: Any
    probe: Sequence[Any]
    example_input: Any
    unique_tokens: int
    probe_heldout: Sequence[Any] | None = None
    unigram_loss: float | None = None
    val_batch: int = 128


def lm_loss(model: Any, x: Any, y: Any) -> Any:
    """Next-token cross-entropy of ``model(x)`` against ``y`` in float32 (logits or an output with ``.logits``).

    Example:
        >>> import torch
        >>> emb = torch.nn.Embedding(5, 5)
        >>> torch.nn.init.zeros_(emb.weight)  # doctest: +ELLIPSIS
        Parameter...
        >>> x, y = torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long)
        >>> round(lm_loss(emb, x, y).item(), 4)  # log 5
        1.6094
    """
    import torch.nn.functional as F

    out = model(x)
    logits = getattr(out, "logits", out)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def count_parameters(model: Any) -> tuple[int, int]:
    """``(params, params_total)``: every parameter counted once (shared ones once), twice."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total, total


@dataclass(frozen=True)
class Recipe:
    """A user's LayerNorm-vs-DyT cell, for ``satmon grid`` (the contract: this module's docstring, docs/guides/grid.md).

    Attributes:
        name: the recipe's name (in the grid JSON and the cells' key).
        data: ``data(spec: CellSpec) -> CellData``.
        model: ``model(spec: CellSpec, norm: str) -> torch.nn.Module`` (``norm`` in :data:`NORMS`).
        tokens_per_step: tokens one optimizer step processes (batch x sequence), a number or a function of the
            options; turns a budget in epochs into tokens, and is the planned tokens of the forecast.
        options: the recipe's options and their defaults (``--option KEY=VALUE`` overrides one, typed as its
            default); part of every cell's key.
        version: bump it when the recipe's meaning changes without its file changing (part of the key).
        loss: ``loss(model, inputs, targets) -> scalar`` (default :func:`lm_loss`).
        params: ``params(model) -> (params, params_total)``: the parameters the tokens-per-parameter axis counts
            (default: every parameter, for both).
        cost: ``cost(size) -> float``: relative cost of a step at ``size`` (the ETA and the order: larger first).
        presets: named grids, ``{name: {"sizes": ..., "budgets": ..., "seeds": ..., "settings": {...},
            "options": {...}, "size_budgets": {...}}}`` (``--preset NAME``).
        shared: ``shared(options) -> dict``: the options as the key and the cells record them (default: as given).
        check: ``check(spec)`` raises ``ValueError`` for a cell the recipe cannot build (an unknown size name, a
            budget its data cannot hold), naming the option; every cell is checked before any job starts.
        describe: ``describe(spec) -> dict``: the recipe's own fields in each cell's record (width, depth, ...).
        arms: the arms of every cell (``model(spec, arm)`` builds each); the first is the reference arm, which every
            other arm must match on the tensors they share at the start. An arm named ``"dyt"`` or ``"dyt-..."``
            must hold DyT layers and is screened; every other arm must hold none. Default :data:`NORMS`.
        late_options: options added after cells were keyed, with their defaults: at the default they enter neither
            the key nor the record (the cells keyed before them stay valid); set, they enter both.

    Example:
        >>> r = Recipe("toy", data=lambda spec: None, model=lambda spec, norm: None, tokens_per_step=64)
        >>> r.step_tokens(), r.options_with({})
        (64, {})
    """

    name: str
    data: Callable[[CellSpec], CellData]
    model: Callable[[CellSpec, str], Any]
    tokens_per_step: int | Callable[[Mapping[str, Any]], int]
    options: Mapping[str, Any] = field(default_factory=dict)
    version: str = "1"
    loss: Callable[[Any, Any, Any], Any] = lm_loss
    params: Callable[[Any], tuple[int, int]] = count_parameters
    cost: Callable[[str], float] | None = None
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    shared: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    check: Callable[[CellSpec], None] | None = None
    describe: Callable[[CellSpec], Mapping[str, Any]] | None = None
    arms: tuple[str, ...] = NORMS
    late_options: Mapping[str, Any] = field(default_factory=dict)

    def all_options(self) -> dict[str, Any]:
        """Every option and its default (``options`` and ``late_options``)."""
        return {**dict(self.options), **dict(self.late_options)}

    def keyed_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` less the late options left at their defaults (what the cells' key holds)."""
        return {k: v for k, v in options.items() if not (k in self.late_options and v == self.late_options[k])}

    def pick_arms(self, arms: str | Sequence[str] | None) -> tuple[str, ...]:
        """The arms ``--arms`` picks (in the recipe's order; the reference arm is always run), or the recipe's.

        Example:
            >>> r = Recipe("toy", data=None, model=None, tokens_per_step=1, arms=("rmsnorm", "dyt", "dyt-gelu"))
            >>> r.pick_arms("dyt-gelu,rmsnorm"), r.pick_arms(None)
            (('rmsnorm', 'dyt-gelu'), ('rmsnorm', 'dyt', 'dyt-gelu'))
        """
        if arms is None:
            names = list(self.arms)
        else:
            names = (
                [a.strip() for a in arms.split(",") if a.strip()] if isinstance(arms, str) else [str(a) for a in arms]
            )
        unknown = [a for a in names if a not in self.arms]
        if unknown or not names:
            raise ValueError(
                f"Expected --arms among the recipe {self.name!r}'s arms ({', '.join(self.arms)}), got "
                f"{', '.join(unknown) if unknown else 'none'}."
            )
        if self.arms[0] not in names:
            raise ValueError(
                f"Expected --arms to include the reference arm {self.arms[0]!r} (every arm is compared with "
                f"it), got {', '.join(names)}."
            )
        if len(set(names)) != len(names):
            raise ValueError(f"Expected distinct --arms, got {', '.join(names)}.")
        if not any(is_dyt_arm(a) for a in names):  # a cell compares a DyT arm with the reference: none, no cell
            dyt = [a for a in self.arms if is_dyt_arm(a)]
            raise ValueError(
                f"Expected at least one DyT arm ('dyt' or 'dyt-...') among --arms (the recipe "
                f"{self.name!r}'s arms: {', '.join(self.arms)}), got {', '.join(names)}: "
                + (
                    f"add one, e.g. --arms {','.join(names + dyt[:1])}."
                    if dyt
                    else "the recipe declares none: add a 'dyt' arm to its arms."
                )
            )
        return tuple(a for a in self.arms if a in names)

    def step_tokens(self, options: Mapping[str, Any] | None = None) -> int:
        """Tokens per optimizer step under ``options`` (default: the recipe's)."""
        opts = dict(self.options) if options is None else dict(options)
        n = self.tokens_per_step(opts) if callable(self.tokens_per_step) else self.tokens_per_step
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"Expected the recipe {self.name!r}'s tokens_per_step to be an integer >= 1, got {n!r}.")
        return n

    def options_with(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The recipe's options updated by ``given``; an unknown key, or a value of another type than the default's,
        is refused naming the option."""
        out = self.all_options()
        for key, value in given.items():
            if key not in out:
                raise ValueError(
                    f"Expected --option KEY among the recipe {self.name!r}'s options "
                    f"({', '.join(sorted(out)) or 'it has none'}), got {key!r}."
                )
            out[key] = _typed(key, value, out[key])
        return out

    def shared_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as the cells' key and records hold them."""
        from satmon.grid.config import options_json

        options = self.keyed_options(options)
        return options_json(self.shared(options) if self.shared is not None else options)


def _typed(key: str, value: Any, default: Any, flag: str = "--option") -> Any:
    """``value`` (a string from the command line, or a Python value) as the type of ``default``; a number that is
    not finite (``nan``, ``inf``, ``1e400``) is refused naming ``flag`` and ``key``: no cell trains on it.

    Example:
        >>> _typed("lr", "1e-3", 3e-3, "--vary")
        0.001
        >>> _typed("alpha_init", "nan", 2.0, "--vary")
        Traceback (most recent call last):
        ...
        ValueError: Expected --vary alpha_init= a finite number (its default is 2.0), got 'nan': pass a finite value.
    """
    typed = value
    if isinstance(value, str) and not isinstance(default, str) and default is not None:
        try:
            if isinstance(default, bool):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                typed = value.lower() in ("true", "1")
            elif isinstance(default, int):
                typed = int(value)
            elif isinstance(default, float):
                typed = float(value)
        except ValueError:
            kind = type(default).__name__
            raise ValueError(
                f"Expected {flag} {key}= {'an' if kind[0] in 'aeiou' else 'a'} {kind} (its default is "
                f"{default!r}), got {value!r}."
            ) from None
    if isinstance(typed, float) and not math.isfinite(typed):
        raise ValueError(
            f"Expected {flag} {key}= a finite number (its default is {default!r}), got {value!r}: pass a finite value."
        )
    return typed


def load_recipe(spec: str) -> tuple[Recipe, str]:
    """The :class:`Recipe` that ``spec`` names, and the spec as a job re-imports it (``builtin`` -> satmon's; a file
    path made absolute).

    Raises:
        satmon.errors.UsageError: ``spec`` cannot be imported, or names something else than a Recipe.

    Example:
        >>> recipe, where = load_recipe("builtin")
        >>> recipe.name, where
        ('satmon-faithful-gpt', 'satmon.grid.builtin:RECIPE')
    """
    from satmon.errors import UsageError
    from satmon.replaying.user_code import import_object

    where = BUILTINS.get(spec, spec)
    source, sep, attr = where.rpartition(":")
    if sep and (source.endswith(".py") or "/" in source or "\\" in source):
        where = f"{Path(source).resolve()}:{attr}"
    obj = import_object(where, "RECIPE", "mypkg.grid:RECIPE")
    if not isinstance(obj, Recipe):
        raise UsageError(
            f"Expected RECIPE {spec} to name a satmon.grid.Recipe, got {type(obj).__name__}: wrap your "
            "functions as RECIPE = satmon.grid.Recipe(name=..., data=..., model=..., tokens_per_step=...) "
            "(docs/guides/grid.md has a complete example)."
        )
    return obj, where


def recipe_identity(recipe: Recipe, where: str) -> dict[str, Any]:
    """What names the recipe in every cell's key: its spec, name, version and the SHA-256 of the source file that
    defines its ``model`` and ``data`` functions (an edited recipe file makes new cells, never mixed with old ones).

    Example:
        >>> recipe, where = load_recipe("builtin")
        >>> sorted(recipe_identity(recipe, where))
        ['name', 'source_sha256', 'spec', 'version']
    """
    digests = []
    for fn in (recipe.model, recipe.data):
        try:
            text = Path(inspect.getsourcefile(fn) or "").read_bytes()
        except (OSError, TypeError):
            text = b""
        digests.append(hashlib.sha256(text).hexdigest())
    return {
        "spec": where,
        "name": recipe.name,
        "version": recipe.version,
        "source_sha256": sorted(set(digests))[0] if len(set(digests)) == 1 else ",".join(digests),
    }


def recipe_file(where: str) -> Path | None:
    """The file a ``path/to/file.py:ATTR`` spec names; ``None`` for ``MODULE:ATTR``.

    Example:
        >>> recipe_file("/r/my_recipe.py:RECIPE"), recipe_file("satmon.grid.builtin:RECIPE")
        (PosixPath('/r/my_recipe.py'), None)
    """
    source, sep, _ = where.rpartition(":")
    return Path(source) if sep and (source.endswith(".py") or "/" in source or "\\" in source) else None


def snapshot_recipe(where: str, identity: Mapping[str, Any], folder: Path) -> str:
    """The spec a grid's jobs import: for ``path/to/file.py:ATTR``, a copy of that file as the grid keyed it
    (``folder/<sha256 prefix>/<file name>``), so a file edited while the grid runs trains no later cell under the
    first version's key; ``MODULE:ATTR`` as given (each job checks its code against the key instead:
    :func:`check_identity`).

    Raises:
        ValueError: the file changed between the grid reading it and the copy (run the command again).
    """
    path = recipe_file(where)
    if path is None:
        return where
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest not in str(identity.get("source_sha256", "")).split(","):
        raise ValueError(
            f"Expected the recipe file {path} to stay as the grid read it while the grid starts, got it "
            "changed (its SHA-256 differs from the one its cells are keyed by): run the command again."
        )
    from satmon.io.atomic import atomic_write

    copy = folder / digest[:16] / path.name
    if not (copy.is_file() and hashlib.sha256(copy.read_bytes()).hexdigest() == digest):
        copy.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(copy, data)
    return f"{copy.absolute()}:{where.rpartition(':')[2]}"


def check_identity(recipe: Recipe, expected: Mapping[str, Any]) -> None:
    """In a job: the recipe it imported must be the code the cell's key names (``expected``: the grid's
    :func:`recipe_identity`); else refuse, naming what changed, so no cell is trained with other code under its key.

    Raises:
        ValueError: the recipe's name, version or source differs from the key's.
    """
    got = recipe_identity(recipe, str(expected.get("spec", "")))
    differ = [k for k in ("name", "version", "source_sha256") if got.get(k) != expected.get(k)]
    if differ:
        want = ", ".join(f"{k} {str(expected.get(k))[:20]}" for k in differ)
        have = ", ".join(f"{k} {str(got.get(k))[:20]}" for k in differ)
        raise ValueError(
            f"Expected the recipe {expected.get('spec')} as the grid keyed its cells ({want}), got "
            f"{have}: its code changed after the grid started; rerun the command (the changed code's "
            "cells get new keys)."
        )
