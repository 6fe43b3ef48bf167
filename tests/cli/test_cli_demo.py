"""``satmon demo``: the losses it prints beside the verdict, its model recipes and its progress bar."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
import torch
from torch import nn

from satmon.cli.demo import heldout_loss, main, unigram_loss
from satmon.demos.corpus import CorpusDataModule


@pytest.fixture(scope="module")
def data() -> CorpusDataModule:
    dm = CorpusDataModule(seq_len=16, batch_size=4, train_tokens=2_000, val_tokens=600)
    dm.setup("fit")
    return dm


class Constant(nn.Module):
    """Logits that ignore the input: a known loss."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(*idx.shape, -1)


def test_heldout_loss_of_uniform_logits_is_log_256(data):
    model = Constant(torch.zeros(256)).train()
    assert heldout_loss(model, data, batches=3) == pytest.approx(math.log(256), rel=1e-6)
    assert model.training  # its mode is restored


def test_heldout_loss_reads_the_first_batches_and_equals_float64_cross_entropy(data):
    logits = torch.randn(256, generator=torch.Generator().manual_seed(0))
    targets = torch.cat([data.val_set[i][1] for i in range(2 * data.batch_size)])  # the first 2 batches
    ref = float(-torch.log_softmax(logits.double(), -1)[targets].mean())
    assert heldout_loss(Constant(logits), data, batches=2) == pytest.approx(ref, rel=1e-6)


def test_unigram_loss_equals_add_one_byte_frequencies(data):
    counts = Counter(data.train_set.tokens.tolist())
    total = sum(counts.values()) + 256
    targets = [t for i in range(3 * data.batch_size) for t in data.val_set[i][1].tolist()]
    ref = -sum(math.log((counts[t] + 1) / total) for t in targets) / len(targets)
    assert unigram_loss(data, batches=3) == pytest.approx(ref, rel=1e-12)
    # a model with the byte frequencies as constant logits scores exactly that level
    freq = torch.tensor([counts[b] + 1.0 for b in range(256)], dtype=torch.float64)
    assert heldout_loss(Constant(freq.div(freq.sum()).log().float()), data, batches=3) == pytest.approx(ref, rel=1e-5)


def _ckpt_hparams(root, name):
    (path,) = (root / name).glob("version_0/checkpoints/*.ckpt")
    return torch.load(path, map_location="cpu", weights_only=False)["hyper_parameters"]


def test_demo_prints_verdict_and_losses_with_a_step_progress_bar(tmp_path, capsys):
    args = ["--window", "4", "--train-tokens", "20000", "--logdir", str(tmp_path), "--threads", "1"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "satmon verdict: " in out and "window 4 steps" in out
    start, end, level = map(
        float,
        re.search(
            r"Validation loss .*?: (\S+) at step 0 -> (\S+) at step 4 "
            r"\(byte-frequency level (\S+)\)",
            out,
        ).groups(),
    )
    assert start > level and end < start  # four steps from random init: above byte frequencies, going down
    assert "steps (window 4)" in out + err and "4/4" in out + err and "Epoch" not in out + err  # one bar over the steps
    assert _ckpt_hparams(tmp_path, "demo")["emb_std"] == 64**-0.5

    assert main(args + ["--stalled", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "satmon verdict: " in out and "steps (window" not in out + err
    assert _ckpt_hparams(tmp_path, "demo_stalled")["emb_std"] == 0.02  # GPT-2's init, the 0.1 demo model


def _saved(root, name="demo"):
    """step -> the global step stored in each checkpoint the run kept, by file name."""
    files = sorted((root / name).glob("version_0/checkpoints/*.ckpt"))
    return {
        int(f.stem.rsplit("step=", 1)[1]): torch.load(f, map_location="cpu", weights_only=False)["global_step"]
        for f in files
    }


def test_demo_keeps_a_checkpoint_every_n_steps_and_the_last(tmp_path, capsys):
    """What --help promises: every --checkpoint-every steps and the last step, all kept (0: the last only)."""
    help_text = _help(capsys)
    assert "every N optimizer steps and at the last step, all kept" in " ".join(help_text.split())
    base = ["--window", "4", "--steps", "7", "--train-tokens", "20000", "--threads", "1", "--quiet"]
    assert main(base + ["--checkpoint-every", "3", "--logdir", str(tmp_path / "every3")]) == 0
    out = capsys.readouterr().out
    # the GPT demo's first line as before --arch, and no watch lines past the window
    assert out.startswith(
        "satmon demo: GPT-2-style model (d=64, 2 blocks, DyT alpha_init 2.0, embeddings at std "
        "d_model^-0.5 = 0.125) on the embedded corpus (Python's standard library), 4-step screening "
        "window, CPU.\n"
    )
    assert "ollapse watch" not in out and "Gradient below the head" not in out
    assert _saved(tmp_path / "every3") == {3: 3, 6: 6, 7: 7}  # each file holds the step its name says
    assert (
        f"Checkpoints (steps 3, 6, 7): {(tmp_path / 'every3' / 'demo' / 'version_0' / 'checkpoints').resolve()}" in out
    )
    assert main(base + ["--checkpoint-every", "0", "--logdir", str(tmp_path / "last")]) == 0
    assert _saved(tmp_path / "last") == {7: 7}


def _help(capsys) -> str:
    assert main(["--help"]) == 0
    return capsys.readouterr().out


def test_ctrl_c_during_training_ends_with_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    """Lightning turns a KeyboardInterrupt into sys.exit(1) after its graceful shutdown: the demo reports it
    as an interrupt (exit 130, one line, no traceback) and gives SIGINT its handler back."""
    import signal

    from lightning.pytorch.callbacks import Callback

    from satmon.cli import demo
    from satmon.cli.main import main as satmon_main

    class CtrlC(Callback):
        def on_train_batch_end(self, *_):
            raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_step_bar", lambda window: CtrlC())
    handler = signal.getsignal(signal.SIGINT)
    assert (
        satmon_main(["demo", "--window", "4", "--train-tokens", "20000", "--logdir", str(tmp_path), "--threads", "1"])
        == 130
    )
    err = capsys.readouterr().err
    assert "satmon demo: interrupted (Ctrl-C)" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is handler


LLAMA_TINY = [
    "--arch",
    "llama",
    "--window",
    "4",
    "--d-model",
    "16",
    "--layers",
    "1",
    "--seq-len",
    "16",
    "--batch-size",
    "4",
    "--train-tokens",
    "20000",
    "--threads",
    "1",
    "--quiet",
]


def test_demo_arch_llama_trains_past_the_window_and_prints_the_gated_path_and_the_watch(tmp_path, capsys):
    """--arch llama: DyT feeds SwiGLU gates (the card says so), the run goes on past the window so the collapse watch
    checks it (the step after each 50th: step 51 here), RMSNorm before the head by default; --final-norm dyt is
    the trapped layout, in its own run folder."""
    assert main(LLAMA_TINY + ["--steps", "51", "--logdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "satmon demo: LLaMA-style model (d=16, 1 blocks, RoPE, SwiGLU; DyT block norms alpha_init 0.8 / "
        "0.2, RMSNorm before the head)"
    )
    assert "Gated MLP after DyT: yes (model.blocks.0.mlp_norm)" in out
    watch = re.search(r"Collapse watch after the window .*?: step (\d+): (\S+); no collapse risk flagged\.", out)
    assert watch and watch[1] == "51" and 0 <= float(watch[2]) < 0.5, out
    assert re.search(
        r"Gradient below the head at step 51 .*: largest \|grad\| \S+ at the token embedding, \S+ in the "
        r"blocks\.\n",
        out,
    )
    hp = _ckpt_hparams(tmp_path, "demo_llama")
    assert hp["arch"] == "llama" and hp["final_norm"] == "rmsnorm" and hp["n_layers"] == 1 and hp["warmup"] == 100
    assert main(LLAMA_TINY + ["--final-norm", "dyt", "--checkpoint-every", "0", "--logdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "DyT before the head, alpha_init 0.2 (--final-norm dyt: the trapped layout)" in out
    assert "Trained 105 steps" in out  # by default the window and 101 steps more
    assert re.search(r"the final DyT's tanh is exactly \+-1 on \S+% of its elements\.", out)
    assert _ckpt_hparams(tmp_path, "demo_llama_final_dyt")["final_norm"] == "dyt"


def test_demo_gradient_below_head_reads_a_trapped_model_as_zero_and_a_learning_one_not():
    """A hand-made trap: the final DyT's input pushed far past tanh's float32 range by a constant offset on the
    embedding (every token's), so no gradient reaches the embedding or the blocks; RMSNorm in its place passes one."""
    from satmon.cli.demo import gradient_below_head
    from satmon.demos.llama import LlamaLM

    dm = CorpusDataModule(seq_len=16, batch_size=4, train_tokens=2_000, val_tokens=600)
    dm.setup("fit")
    for final in ("dyt", "rmsnorm"):
        torch.manual_seed(0)
        model = LlamaLM(d_model=16, n_layers=1, n_heads=2, seq_len=16, final_norm=final)
        with torch.no_grad():
            model.tok_emb.weight.add_(torch.where(torch.arange(16) % 2 == 0, 100.0, -100.0))  # alpha 0.2 x 100 = 20
        got = gradient_below_head(model, dm)
        if final == "dyt":
            assert got == {"grad_embedding": 0.0, "grad_blocks": 0.0, "final_tanh_at_one": 1.0}
        else:
            assert got["grad_embedding"] > 0 and got["grad_blocks"] > 0 and got["final_tanh_at_one"] is None
            assert all(p.grad is None for p in model.parameters())  # read without touching .grad


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--arch", "llama", "--stalled"], "expected --stalled with --arch gpt only"),
        (["--final-norm", "dyt"], "expected --final-norm with --arch llama only, got --final-norm dyt with --arch gpt"),
        (["--arch", "llama", "--final-norm", "layernorm"], "invalid choice: 'layernorm'"),
        (["--arch", "llama", "--d-model", "12"], "expected --d-model to be a multiple of 8 with --arch llama"),
    ],
)
def test_demo_arch_flags_refused_before_work(flags, message, tmp_path, capsys):
    assert main(flags + ["--logdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and not list(tmp_path.iterdir())  # nothing built or written
