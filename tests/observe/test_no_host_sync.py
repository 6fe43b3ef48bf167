"""No host sync on satmon's per-step path, proved on the CPU: over counted window steps, a dispatch mode
records every operation that forces a device-to-host read (and every tensor made on the host) issued from
satmon's hooks and from the screen's step calls. On an accelerator each of those would wait for the device.

The CPU path reads one thing on purpose: a scalar CPU ``alpha`` with ``.item()`` (``CountQueue.threshold``,
a CPU scalar with nothing to wait for). The test names it, and runs the accelerator's path
(``host_thresholds=False``) too, where nothing at all is read. The non-finite guard (``abort_on``) reads
its CPU flag at once; on CUDA it copies it asynchronously and reads it a step later: named as well.
"""

from __future__ import annotations

import contextlib
import traceback
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import satmon
from satmon import Screen
from satmon.demos.gpt import GPT, GPTConfig
from satmon.demos.llama import LlamaLM
from satmon.functional.gate import flat_threshold

#: aten operations that read a device value on the host (``.item()``, ``bool(t)``, data-dependent shapes)
SYNCING = {
    "_local_scalar_dense",
    "is_nonzero",
    "nonzero",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "item",
    "equal",
    "allclose",
    "repeat_interleave",
    "bincount",
    "masked_scatter",
    "histc",
    "histogram",
}
#: Python-level reads that bypass the dispatcher on a CPU tensor (on an accelerator each is a transfer)
HOST_READS = ("tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__")


#: the imported package's folder: a frame is satmon's by where its file lies under it, never by a folder name in its
#: path (a clone in a folder named ``satmon`` holds the tests under ``satmon/`` too)
PACKAGE = Path(satmon.__file__).resolve().parent
#: satmon's files that are the model, not the screen: the demo models and the DyT module itself
MODEL_FILES = (PACKAGE / "demos", PACKAGE / "dyt.py")


def _package_file(filename: str) -> str | None:
    """``filename`` relative to the package (``observe/saturation.py``), or None outside it or in the model's files."""
    path = Path(filename).resolve()
    if not path.is_relative_to(PACKAGE) or any(path == m or path.is_relative_to(m) for m in MODEL_FILES):
        return None
    return path.relative_to(PACKAGE).as_posix()


def _satmon_frame() -> str:
    """The innermost satmon frame of the current stack (``file:function``), tests and the model excluded."""
    for f in reversed(traceback.extract_stack()):
        where = _package_file(f.filename)
        if where is not None:
            return f"{where}:{f.name}"
    return "?"


class SyncRecorder(TorchDispatchMode):
    """Records syncing ops (and host-made tensors) while :attr:`active` (inside satmon's hooks and step calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.active = 0
        self.found: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.active:
            name = func.overloadpacket.__name__
            bool_index = name in ("index", "index_put", "index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or [])
            )
            if name in SYNCING or bool_index:
                self.found.append((f"aten.{name}", _satmon_frame()))
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def on(self):
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


@pytest.fixture
def recorder(monkeypatch):
    rec = SyncRecorder()

    def wrap_register(register):
        def reg(module, hook, *a, **k):
            def recorded(*args, **kw):
                with rec.on():
                    return hook(*args, **kw)

            return register(module, recorded, *a, **k)

        return reg

    # every hook registered during the test is satmon's (the test registers none): run each one recorded
    monkeypatch.setattr(nn.Module, "register_forward_hook", wrap_register(nn.Module.register_forward_hook))
    monkeypatch.setattr(nn.Module, "register_forward_pre_hook", wrap_register(nn.Module.register_forward_pre_hook))
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def read(t, *a, _original=original, _name=name, **k):
            if rec.active:
                rec.found.append((f"Tensor.{_name}", _satmon_frame()))
            return _original(t, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, read)
    for name in ("tensor", "as_tensor", "from_numpy"):  # tensors made on the host: a host-to-device copy on a GPU
        original = getattr(torch, name)

        def made(*a, _original=original, _name=name, **k):
            if rec.active:
                rec.found.append((f"torch.{_name}", _satmon_frame()))
            return _original(*a, **k)

        monkeypatch.setattr(torch, name, made)
    with rec:
        yield rec


def _train(
    model: nn.Module,
    screen: Screen,
    rec: SyncRecorder,
    steps: int,
    keep_inputs: bool,
    window: int,
    host_thresholds: bool = True,
) -> list[list[tuple[str, str]]]:
    """A plain loop; returns what was recorded in each optimizer step (the step calls and the hooks)."""
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rec.on():
        screen.attach(model, keep_inputs=keep_inputs)
    for h in (screen.hooks, screen.watch.hooks if screen.watch else None):
        if h is not None:
            h.queue.host_thresholds = host_thresholds
    per_step = []
    for _ in range(steps):
        rec.found = []
        x = torch.randint(0, 64, (4, 16))
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        if keep_inputs:
            with rec.on():
                screen.count_kept()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        with rec.on():
            screen.step(loss.detach())
        per_step.append(rec.found)
    assert screen.verdict is not None and screen.verdict.window == window
    return per_step


WINDOW = 9


def _models():
    return {
        "gpt": lambda: GPT(GPTConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, seq_len=16)),
        "llama (gated MLPs: gate statistics too)": lambda: LlamaLM(
            vocab_size=64, d_model=32, n_layers=2, n_heads=2, seq_len=16
        ),
    }


@pytest.mark.parametrize("keep_inputs", [False, True], ids=["counted in the hooks", "kept, counted after the forward"])
@pytest.mark.parametrize("arch", list(_models()))
def test_the_accelerator_path_reads_nothing_on_the_host_over_counted_window_steps(recorder, arch, keep_inputs):
    model = _models()[arch]()
    # the trap watch off: its check steps read by design (test_the_trap_watch_reads_only_on_its_check_steps)
    screen = Screen(
        window=WINDOW, sample_every=2, offset_every=1, log_every_n_steps=10**6, verbose=False, trap_every_n_steps=0
    )
    # The gate hooks are made at the first forward (gating is read from it) and place each gate activation's flat
    # tail once per process (``flat_threshold``, cached): host arithmetic on float64 CPU tensors of its own, never a
    # read of the device. Cleared so that the first step sees it whatever ran before in this process.
    flat_threshold.cache_clear()
    per_step = _train(model, screen, recorder, WINDOW + 1, keep_inputs, WINDOW, host_thresholds=False)
    # steps 0 .. WINDOW - 2: counted (even) and uncounted (odd) window steps, offset statistics on every counted one;
    # the last window step ends with the verdict (one read, by design) and is left out
    first = [entry for entry in per_step[0] if entry[1] != "functional/gate.py:flat_threshold"]
    assert (len(first) < len(per_step[0])) is (screen.gate_hooks is not None)  # placed at the first forward, if gated
    window_steps = [first] + per_step[1 : WINDOW - 1]
    assert window_steps == [[]] * (WINDOW - 1), window_steps
    assert screen.verdict.elements > 0 and screen.offset_hooks is not None


def test_the_cpu_path_reads_only_its_scalar_alphas(recorder):
    model = _models()["gpt"]()
    screen = Screen(window=WINDOW, sample_every=2, log_every_n_steps=10**6, verbose=False, trap_every_n_steps=0)
    per_step = _train(model, screen, recorder, WINDOW + 1, True, WINDOW)
    found = {entry for step in per_step[: WINDOW - 1] for entry in step}
    # the named exception: a CPU scalar alpha read with .item() for its threshold (on a GPU: the tensor path above)
    assert found == {
        ("aten._local_scalar_dense", "observe/saturation.py:threshold"),
        ("Tensor.item", "observe/saturation.py:threshold"),
    }
    reads = [len(s) for s in per_step[: WINDOW - 1]]
    n_layers = len(screen.layers)
    # once per layer per counted step
    assert reads == [2 * n_layers if step % 2 == 0 else 0 for step in range(WINDOW - 1)]


def test_a_step_with_the_nonfinite_guard_reads_only_its_named_cpu_flag(recorder):
    model = _models()["gpt"]()
    screen = Screen(
        window=WINDOW, sample_every=2, abort_on="any", log_every_n_steps=10**6, verbose=False, trap_every_n_steps=0
    )
    per_step = _train(model, screen, recorder, WINDOW + 1, False, WINDOW, host_thresholds=False)
    guard = {
        ("aten._local_scalar_dense", "screen/nonfinite_guard.py:poll"),
        ("Tensor.item", "screen/nonfinite_guard.py:poll"),
    }
    # the guard folds the counts every step: the fold's device index and totals are made at the first counted
    # step (its call pattern) and reused after; on the CPU only, the guard reads its flag at once (on CUDA: a
    # pinned asynchronous copy, read a step later)
    assert set(per_step[0]) == guard | {("torch.tensor", "observe/saturation.py:_fold_tensors")}
    assert {entry for step in per_step[1 : WINDOW - 1] for entry in step} == guard


def test_the_recorder_sees_host_reads_and_syncing_ops(recorder):
    """The proof above can fail: reads inside a recorded section are seen, outside they are not."""
    t = torch.tensor([1.0, -2.0])
    with recorder.on():
        bool(t.sum() > 0)
        t.max().item()
        t[t > 0]
        torch.tensor([3])
    bool(t.sum() > 0)  # not recorded: outside satmon
    names = [op for op, _ in recorder.found]
    assert names.count("Tensor.__bool__") == 1 and names.count("Tensor.item") == 1
    assert names.count("aten._local_scalar_dense") == 2  # bool() and .item() both read the value
    assert "aten.index" in names and "torch.tensor" in names  # a boolean mask (a data-dependent shape), a host tensor


def test_the_fused_path_reads_only_its_scalar_alphas(recorder, monkeypatch):
    """The fused count, forced, its traced ATen graph run uncompiled so that the recorder sees every op of it (Inductor
    compiles this same graph and calls its kernels without the dispatcher). The first counted step traces the graph and
    checks it against the eager count once (``torch.equal``: named); every later counted step reads only the CPU scalar
    alphas, as the four-op path does; and the graph itself holds no op that reads a value on the host."""
    import satmon.observe.saturation as sat

    graphs = []

    def graph(gm, example):
        graphs.append(gm)
        return gm

    monkeypatch.setattr(sat, "_dispatch_mode_active", lambda: False)  # the recorder is a dispatch mode: let it watch
    monkeypatch.setattr(sat, "_COMPILED", {})
    monkeypatch.setattr(sat, "_FAILED", {})
    monkeypatch.setattr(sat.CountQueue, "default_fused", True)
    monkeypatch.setattr(sat.CountQueue, "default_backend", graph)
    model = _models()["gpt"]()
    screen = Screen(window=WINDOW, sample_every=2, log_every_n_steps=10**6, verbose=False, trap_every_n_steps=0)
    per_step = _train(model, screen, recorder, WINDOW + 1, True, WINDOW)
    n_layers = len(screen.layers)
    assert screen.hooks.queue.inputs_counted == {"fused": n_layers * (WINDOW + 1) // 2, "four ops": 0}
    assert len(graphs) == 1
    alpha_reads = {
        ("aten._local_scalar_dense", "observe/saturation.py:threshold"),
        ("Tensor.item", "observe/saturation.py:threshold"),
    }
    assert set(per_step[0]) == alpha_reads | {("aten.equal", "observe/saturation.py:compile_counts")}
    assert {entry for step in per_step[1 : WINDOW - 1] for entry in step} == alpha_reads
    assert [len(s) for s in per_step[1 : WINDOW - 1]] == [
        2 * n_layers if step % 2 == 0 else 0 for step in range(1, WINDOW - 1)
    ]
    ops = {node.target.overloadpacket.__name__ for node in graphs[0].graph.nodes if node.op == "call_function"}
    assert {"abs", "gt", "sum", "any"} <= ops and not ops & SYNCING, ops


def test_frames_are_satmons_by_the_package_folder_not_by_a_folder_name(tmp_path):
    """A clone in a folder named ``satmon`` (``.../satmon/tests/...``) holds no satmon frame: only files under the
    imported package count, the demo models and the DyT module excluded."""
    import satmon.observe.saturation as saturation

    assert _package_file(saturation.__file__) == "observe/saturation.py"
    assert _package_file(__file__) is None
    clone = tmp_path / "satmon" / "tests" / "observe" / "test_no_host_sync.py"
    assert _package_file(str(clone)) is None
    assert _package_file(str(PACKAGE / "demos" / "gpt.py")) is None and _package_file(str(PACKAGE / "dyt.py")) is None


def test_the_trap_watch_reads_only_on_its_check_steps(recorder, monkeypatch):
    """The trap watch on (every 4 steps from step 1), the window's path the accelerator's (it reads nothing): the
    steps the trap watch does not check read nothing, its gradient hooks included; a checked step reads once."""
    register = torch.Tensor.register_post_accumulate_grad_hook

    def recorded_register(t, hook):
        def recorded(*a, **k):
            with recorder.on():
                return hook(*a, **k)

        return register(t, recorded)

    monkeypatch.setattr(torch.Tensor, "register_post_accumulate_grad_hook", recorded_register)
    model = _models()["llama (gated MLPs: gate statistics too)"]()
    screen = Screen(
        window=WINDOW, sample_every=2, offset_every=0, log_every_n_steps=10**6, verbose=False, trap_every_n_steps=4
    )
    flat_threshold.cache_clear()
    per_step = _train(model, screen, recorder, WINDOW + 1, False, WINDOW, host_thresholds=False)
    per_step[0] = [e for e in per_step[0] if e[1] != "functional/gate.py:flat_threshold"]  # placed once (see above)
    checked = [i for i in range(WINDOW - 1) if i % 4 == 0]  # loop steps 0, 4: optimizer steps 1 and 5
    assert [per_step[i] for i in range(WINDOW - 1) if i not in checked] == [[]] * (WINDOW - 1 - len(checked))
    reads = [("Tensor.tolist", "observe/trap.py:read"), ("Tensor.tolist", "screen/trap.py:check")]
    # one read of the offset counts, one of the gradient norms, at the check, in step(); the first check also maps each
    # parameter to its group once (a host-made index, copied to the device)
    assert sorted(per_step[0]) == sorted([*reads, ("torch.tensor", "screen/trap.py:_group_of")])
    assert all(sorted(per_step[i]) == reads for i in checked[1:])
    assert [r["step"] for r in screen.trap.log][:2] == [1, 5]


def test_a_collapse_watch_in_the_window_reads_only_on_its_check_steps(recorder):
    """``watch_from=2``, one step in 3: the watch runs beside the window (the accelerator's path, which reads nothing);
    the window's steps it does not check read nothing, its selection included; a checked step reads."""
    model = _models()["llama (gated MLPs: gate statistics too)"]()
    screen = Screen(
        window=WINDOW,
        sample_every=2,
        offset_every=0,
        log_every_n_steps=10**6,
        verbose=False,
        trap_every_n_steps=0,
        watch_every_n_steps=3,
        watch_from=2,
    )
    flat_threshold.cache_clear()
    per_step = _train(model, screen, recorder, WINDOW + 1, False, WINDOW, host_thresholds=False)
    per_step[0] = [e for e in per_step[0] if e[1] != "functional/gate.py:flat_threshold"]  # placed once (see above)
    checked = [3, 6]  # loop steps 3, 6: optimizer steps 3 and 6 watched, read when they end (steps 4 and 7)
    assert [r["step"] for r in screen.watch.log][:2] == [4, 7]
    assert [per_step[i] for i in range(WINDOW - 1) if i not in checked] == [[]] * (WINDOW - 1 - len(checked))
    assert all(per_step[i] for i in checked)
