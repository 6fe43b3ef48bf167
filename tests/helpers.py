"""Shared test helpers: tiny models, data, a Trainer, hook sets, a recording sink and the DDP launcher (the float64
reference lives in ``reference.py``)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from collections.abc import Mapping, Sequence

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from satmon import find_dyt_layers
from satmon.demos.lit import LitLM
from satmon.observe.counters import SaturationCounter
from satmon.observe.saturation import SaturationHooks


def tiny_lit(**overrides) -> LitLM:
    cfg = dict(arch="gpt", d_model=32, n_layers=2, n_heads=2, seq_len=16, alpha_init=2.0, lr=3e-3, warmup=1)
    cfg.update(overrides)
    return LitLM(**cfg)


def token_loader(
    n_batches: int = 8, batch_size: int = 4, seq_len: int = 16, seed: int = 0, vocab: int = 256
) -> DataLoader:
    """Fixed random token windows (shuffle off, so reruns and resumes see the same data)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n_batches * batch_size, seq_len + 1), generator=g)
    return DataLoader(TensorDataset(x[:, :-1], x[:, 1:]), batch_size=batch_size, shuffle=False)


def trainer(tmp_path, **kw) -> pl.Trainer:
    args = dict(
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    args.update(kw)
    return pl.Trainer(**args)


def assert_mentions(message: str, *facts: object) -> None:
    """Assert that ``message`` carries every fact a message must carry (the file, the option, the value, what to do),
    wherever and in whatever words it says them: each fact's text (``str(fact)``) appears in it. A test written so
    checks what the user needs from the message, not its sentence; it fails naming the facts that are missing.

    >>> assert_mentions("satmon replay: Expected --data FILE, got a folder (data/); pass a file", "--data", "data/")
    """
    missing = [str(f) for f in facts if str(f) not in message]
    assert not missing, f"Expected the message to mention {missing}, got: {message!r}"


def hooked(model: nn.Module, keep_inputs: bool = False, **counter) -> SaturationHooks:
    """Attached saturation hooks on every DyT layer of ``model`` (``counter``: SaturationCounter options)."""
    layers = find_dyt_layers(model)
    return SaturationHooks(layers, SaturationCounter(len(layers), **counter), keep_inputs=keep_inputs).attach()


def clean_env() -> dict[str, str]:
    """The test process's environment without what an earlier in-process distributed run (Lightning,
    accelerate) may have left there, for a subprocess that starts its own process group."""
    stale = (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "PL_GLOBAL_SEED",
        "TORCHELASTIC_RUN_ID",
    )
    return {
        **{k: v for k, v in os.environ.items() if k not in stale and not k.startswith("ACCELERATE_")},
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
    }


def popen_as_from_a_terminal(argv: Sequence[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv, text=True, **kwargs)`` with SIGINT at its default in the child, as a terminal starts a
    command: a shell that starts a command in the background (``cmd &``) makes it ignore SIGINT, and every process it
    starts inherits that (this test's subject too), so a Ctrl-C the test sends would reach a child that ignores it."""
    return subprocess.Popen(
        list(argv), text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs
    )


#: what a process prints when it ends by ``std::terminate`` (a C++ thread still running at exit): exit -6 (SIGABRT)
TERMINATED = "terminate called"


def run_ranks(
    argv: Sequence[str], *, cwd: str | os.PathLike, env: Mapping[str, str] | None = None, timeout: float
) -> subprocess.CompletedProcess:
    """Run a script that starts processes of its own (Lightning's and Fabric's DDP launchers re-run it for every
    further rank) in a session of its own, wait for all of them, and fail unless every rank exited cleanly.

    Every rank inherits the output pipes, so the call returns when the last one has closed them; whatever is left
    of the session is then killed, and on a timeout the whole session is (no rank outlives the test). Fails, with
    what the ranks printed, on a timeout, on rank 0's non-zero exit, and on a rank that ended by ``std::terminate``
    (:data:`TERMINATED` in the output, exit -6: a thread or a process group still running at exit), since a user's
    DDP job must exit 0. On a timeout every process of the session is first sent SIGABRT, on which Python's
    faulthandler (``PYTHONFAULTHANDLER``, set for the run) prints where each of its threads is: the failure says
    where a rank hung, not only that it did.
    """
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env={**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_no_core_files,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_session(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            _kill_session(proc.pid)
            out, err = proc.communicate()
        raise AssertionError(
            f"Expected {argv[0]} and its ranks to finish within {timeout:.0f} s, got a run still "
            f"going (killed, with every rank)\n{out[-3000:]}\n{err[-5000:]}"
        ) from None
    finally:
        _kill_session(proc.pid)  # a rank that closed its pipes but lingers: never left running past the test
    assert proc.returncode == 0 and TERMINATED not in out + err, (
        f"Expected {argv[0]} to exit 0 on every rank, got exit {proc.returncode}"
        f"{' and std::terminate on a rank' if TERMINATED in out + err else ''}\n{out[-3000:]}\n{err[-5000:]}"
    )
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _no_core_files() -> None:
    """In a rank, before it starts: no core file from the SIGABRT a timeout sends."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _signal_session(pid: int, sig: int) -> None:
    """Send ``sig`` to every process left in the session (process group) that ``pid`` leads."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_session(pid: int) -> None:
    """Kill every process left in the session (process group) that ``pid`` leads."""
    _signal_session(pid, signal.SIGKILL)


class RecordingSink:
    """A satmon sink (with a layout) that records every call, in order: ``calls`` holds
    ``("scalars", values, step)``, ``("text", tag, markdown, step)``, ``("hparams", params, metrics, step)``,
    ``("layout", layout)`` and ``("close",)``."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def scalars(self, values, step):
        self.calls.append(("scalars", dict(values), step))

    def text(self, tag, markdown, step):
        self.calls.append(("text", tag, markdown, step))

    def hparams(self, params, metrics, step):
        self.calls.append(("hparams", dict(params), dict(metrics), step))

    def layout(self, layout):
        self.calls.append(("layout", layout))

    def close(self):
        self.calls.append(("close",))
