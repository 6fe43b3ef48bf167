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
    start, end, level = map(float, re.search(r"Validation loss .*?: (\S+) at step 0 -> (\S+) at step 4 "
                                             r"\(byte-frequency level (\S+)\)", out).groups())
    assert start > level and end < start  # four steps from random init: above byte frequencies, going down
    assert "steps (window 4)" in out + err and "4/4" in out + err and "Epoch" not in out + err  # one bar over the steps
    assert _ckpt_hparams(tmp_path, "demo")["emb_std"] == 64 ** -0.5

    assert main(args + ["--stalled", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "satmon verdict: " in out and "steps (window" not in out + err
    assert _ckpt_hparams(tmp_path, "demo_stalled")["emb_std"] == 0.02  # GPT-2's init, the 0.1 demo model


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
    assert satmon_main(["demo", "--window", "4", "--train-tokens", "20000", "--logdir", str(tmp_path), "--threads", "1"]) == 130
    err = capsys.readouterr().err
    assert "satmon demo: interrupted (Ctrl-C)" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is handler
