"""Every documented command runs, on small inputs.

- README.md is a newcomer's path: its ```python blocks and the ``satmon ...`` commands of its ```bash
  blocks run in document order, in one empty folder (the clone's root before anything was run), each
  after the ones before it and on nothing else: a command that reads what no earlier one wrote fails.
- Each ```python block of docs/*.md is executed (in an empty folder).
- Each ``satmon ...`` command of a ```bash block of docs/*.md is run through satmon's console entry point
  (``satmon.cli.main.main``, in-process), one page at a time in document order, since a page's later
  commands read what its earlier ones wrote. They run in a copy of a small user project that holds
  what the docs name as the user's: ``mypkg.model:MyLit`` / ``mypkg.model:build``, ``calib.pt``,
  ``ckpts/``, ``weights/``, a finished run under ``lightning_logs/version_0/checkpoints``.

The documented words are kept as written; the test only adds to them:

- size flags, appended (argparse keeps the last value): ``satmon demo`` gets its step flags
  (``--window``, default 500, ``--steps``, ``--checkpoint-every``, default 100) divided by one factor so
  that the window is at most 8 steps, their ratios kept; ``satmon replay`` gets ``--batches 1``;
- absolute ``/tmp/...`` paths are mapped into the sandbox, and ``--device cuda`` runs as
  ``--device cpu`` on a machine without a GPU.

Other lines are not run here: ``pip`` and ``pytest`` would recurse into this suite, ``tensorboard``
is a server, and ``python examples/...`` has its own tests (tests/examples/).
"""

from __future__ import annotations

import logging
import math
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))  # README.md: test_readme_runs_in_order
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.DOTALL)
SMALL_WINDOW = 8  # the largest demo window the docs test runs


def blocks(kind: str | None, pages: list[Path] = PAGES) -> list[tuple[str, int, str]]:
    """``(page, line, code)`` of each block of ``kind`` (``None``: python and bash, as ``(page,
    line, "python"|"bash", code)``)."""
    out = []
    for page in pages:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text[: m.start()].count("\n") + 1
            if kind is None:
                out.append((page.name, line, m.group(1), m.group(2)))
            elif m.group(1) == kind:
                out.append((page.name, line, m.group(2)))
    return out


def test_docs_have_blocks():
    assert len(blocks("python")) >= 6 and len(blocks("bash")) >= 3
    assert [k for _, _, k, _ in blocks(None, [README])].count("bash") >= 2


@pytest.mark.parametrize(
    ("page", "line", "code"), blocks("python"), ids=lambda v: str(v)[:40] if isinstance(v, str) else str(v)
)
def test_python_block_runs(page, line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page}_{line}"}
    exec(compile(code, f"{page}:{line}", "exec"), namespace)


# ------------------------------------------------------------------------------------ bash blocks
def commands_of(code: str) -> list[list[str]]:
    """The words of each ``satmon`` command of a bash block (a line's ``&&`` parts; ``\\`` continues a line)."""
    found = []
    for cmd in code.replace("\\\n", " ").splitlines():
        for part in cmd.split("&&"):
            words = shlex.split(part, comments=True)
            if words and words[0] == "satmon":
                found.append(words)
    return found


def satmon_commands() -> dict[str, list[tuple[int, list[str]]]]:
    """Page -> ``(line, words)`` of every ``satmon`` command in its bash blocks, in document order."""
    found: dict[str, list[tuple[int, list[str]]]] = {}
    for page, line, code in blocks("bash"):
        for words in commands_of(code):
            found.setdefault(page, []).append((line, words))
    return found


def _flag(words: list[str], name: str) -> int | None:
    """The last value of ``--name N`` or ``--name=N`` in ``words`` (argparse's rule), or ``None``."""
    value = None
    for i, w in enumerate(words):
        if w == name and i + 1 < len(words):
            value = int(words[i + 1])
        elif w.startswith(name + "="):
            value = int(w.split("=", 1)[1])
    return value


def small(words: list[str], sandbox: Path) -> list[str]:
    """The documented command with small sizes appended and ``/tmp/`` mapped into ``sandbox``."""
    args = [re.sub(r"(^|=)/tmp/", lambda m: f"{m.group(1)}{sandbox}/tmp/", w) for w in words[1:]]
    if not torch.cuda.is_available():
        args = [
            "cpu" if a == "cuda" and i and args[i - 1] == "--device" else a.replace("--device=cuda", "--device=cpu")
            for i, a in enumerate(args)
        ]
    if "-h" in args or "--help" in args:
        return args
    if args[0] == "demo":
        from satmon.cli.demo import CHECKPOINT_EVERY

        window = _flag(args, "--window") or 500
        factor = max(1.0, window / SMALL_WINDOW)
        defaults = {"--window": window, "--checkpoint-every": CHECKPOINT_EVERY}
        for name in ("--window", "--steps", "--checkpoint-every"):
            value = window if name == "--window" else _flag(args, name)
            value = defaults.get(name) if value is None else value
            if value:
                args += [name, str(max(1, math.ceil(value / factor)))]
    elif args[0] == "replay":
        args += ["--batches", "1"]
    return args


USER_MODEL = '''\
"""The user's model, as the docs name it: mypkg.model:MyLit (a LightningModule) and mypkg.model:build."""
from satmon.demos.gpt import GPT, GPTConfig
from satmon.demos.lit import LitLM

CONFIG = dict(d_model=32, n_layers=1, n_heads=2, seq_len=16)


def build():
    return GPT(GPTConfig(**CONFIG))


class MyLit(LitLM):
    def forward(self, input_ids):  # fed by name from a dict batch: model(**batch)
        return self.model(input_ids)
'''


@pytest.fixture(scope="module")
def user_project(tmp_path_factory) -> Path:
    """A folder with what the docs' commands name as the user's (trained for two steps each)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from helpers import token_loader
    from satmon.demos.corpus import CorpusDataModule
    from satmon.demos.lit import LitLM

    root = tmp_path_factory.mktemp("user_project")
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "model.py").write_text(USER_MODEL)
    # commands that read committed docs and data (a copy: outputs stay here)
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copytree(ROOT / "data", root / "data")
    (root / "tmp").mkdir()

    def fit(model, ckpt_dir: Path, **data) -> None:
        pl.seed_everything(0, verbose=False)
        trainer = pl.Trainer(
            max_steps=2,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            callbacks=[ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=2, save_top_k=-1)],
        )
        trainer.fit(model, **data)

    config = dict(arch="gpt", d_model=32, n_layers=1, n_heads=2, seq_len=16, warmup=1)
    fit(
        LitLM(**config),
        root / "lightning_logs" / "version_0" / "checkpoints",
        datamodule=CorpusDataModule(seq_len=16, batch_size=4, train_tokens=4_000, val_tokens=400),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        from mypkg.model import MyLit, build

        fit(MyLit(**config), root / "ckpts", train_dataloaders=token_loader(n_batches=2, seq_len=16))
        (root / "weights").mkdir()
        torch.save(build().state_dict(), root / "weights" / "model.pt")
        sys.modules.pop("mypkg.model", None), sys.modules.pop("mypkg", None)
    torch.save(
        {"input_ids": torch.randint(0, 256, (8, 16), generator=torch.Generator().manual_seed(0))}, root / "calib.pt"
    )
    return root


def run_satmon(page: str, line: int, words: list[str], sandbox: Path, capsys) -> str:
    """Run one documented ``satmon`` command (small sizes); its stdout. Fails unless it exits 0."""
    from satmon.cli.main import SUBCOMMANDS, main

    assert len(words) > 1 and words[1] in SUBCOMMANDS, f"{page}:{line}: unknown satmon command {words}"
    args = small(words, sandbox)
    try:
        rc = main(args)
    except SystemExit as e:  # --help, or argparse rejecting the documented flags
        rc = e.code
    out = capsys.readouterr()
    assert rc == 0, (
        f"{page}:{line}: `{shlex.join(words)}` (run as satmon {shlex.join(args)}) exited {rc}\n"
        f"{out.out[-3000:]}\n{out.err[-3000:]}"
    )
    if words[1] == "demo":
        assert "satmon verdict: " in out.out and "Validation loss" in out.out
    return out.out


@pytest.fixture
def keep_torch_settings():
    threads, level = torch.get_num_threads(), logging.getLogger("lightning.pytorch").level
    yield
    torch.set_num_threads(threads)
    logging.getLogger("lightning.pytorch").setLevel(level)


@pytest.mark.parametrize("page", sorted(satmon_commands()))
def test_satmon_commands_run(page, user_project, tmp_path, monkeypatch, capsys, keep_torch_settings):
    sandbox = tmp_path / "project"
    shutil.copytree(user_project, sandbox)
    monkeypatch.chdir(sandbox)
    monkeypatch.syspath_prepend(str(sandbox))
    for name in ("mypkg", "mypkg.model"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for line, words in satmon_commands()[page]:
        run_satmon(page, line, words, sandbox, capsys)


def test_readme_runs_in_order(tmp_path, monkeypatch, capsys, keep_torch_settings):
    """A newcomer's path through README.md: every python block and ``satmon`` command, in document order, in
    one folder that holds nothing else; each reads only what the ones before it wrote."""
    monkeypatch.chdir(tmp_path)
    ran = []
    for page, line, kind, code in blocks(None, [README]):
        if kind == "python":
            exec(compile(code, f"{page}:{line}", "exec"), {"__name__": f"docs_{page}_{line}"})
            ran.append("python")
        else:
            for words in commands_of(code):
                out = run_satmon(page, line, words, tmp_path, capsys)
                ran.append(" ".join(words[:2]))
                if words[1] == "demo":  # what it says it kept is there, for the replay that follows
                    kept = re.search(r"Checkpoints \(steps ([\d, ]+)\): (\S+)", out)
                    assert kept and len(list(Path(kept.group(2)).glob("*.ckpt"))) == len(kept.group(1).split(","))
    assert ran[0] == "satmon demo" and "python" in ran and "satmon replay" in ran  # the README's path, all of it
