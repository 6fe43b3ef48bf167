"""Where a run sits on the study's phase diagram: its parameters and the unique tokens it trains on,
counted from hand-built datasets whose answer is known (the token positions their samples cover, counted
one by one), and the line SaturationMonitor's card carries."""

from __future__ import annotations

import random
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from helpers import tiny_lit, trainer
from satmon import SaturationMonitor
from satmon.drivers.counting import count_parameters, count_train_tokens, run_scale
from satmon.results.scale import RunScale

pytestmark = pytest.mark.filterwarnings("ignore:.*validation_step.*", "ignore:.*window steps.*", "ignore:.*resum.*")

STREAM = torch.randint(0, 256, (20_000,), generator=torch.Generator().manual_seed(0))


class Windows(Dataset):
    """``(x, y)`` windows of ``seq_len`` tokens over a stream, window ``i`` starting at ``i * stride``."""

    def __init__(self, n: int, seq_len: int = 16, stride: int | None = None) -> None:
        self.n, self.seq_len, self.stride = n, seq_len, stride or seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        s = i * self.stride
        chunk = STREAM[s : s + self.seq_len + 1]
        return chunk[:-1], chunk[1:]

    def positions(self) -> set[int]:
        """The stream positions the inputs cover: the known answer, counted one by one."""
        return {i * self.stride + k for i in range(self.n) for k in range(self.seq_len)}


class Padded(Dataset):
    """Hugging Face style dicts: ``input_ids`` padded to 32, ``attention_mask`` keeping the first 20."""

    def __len__(self) -> int:
        return 50

    def __getitem__(self, i: int):
        ids = STREAM[i * 32 : i * 32 + 32].clone()
        mask = torch.zeros(32, dtype=torch.long)
        mask[:20] = 1
        ids[20:] = 0
        return {"input_ids": ids, "attention_mask": mask, "labels": ids}


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(100):
            chunk = STREAM[i * 17 : i * 17 + 17]
            yield chunk[:-1], chunk[1:]


@pytest.mark.parametrize("stride", [16, 4, 1, 24])
def test_unique_tokens_of_windows_match_the_positions_they_cover(stride):
    data = Windows(300, seq_len=16, stride=stride)
    tokens, how = count_train_tokens(DataLoader(data, batch_size=8, shuffle=True))
    assert tokens == len(data.positions())
    if stride < 16:
        assert f"each {stride} token(s) after the last" in how  # overlapping windows: each token once
    else:
        assert how == "300 samples x 16 tokens in Windows"


def test_padding_the_attention_mask_drops_is_not_counted():
    tokens, how = count_train_tokens(DataLoader(Padded(), batch_size=4))
    assert tokens == 50 * 20 and "tokens the attention mask keeps" in how


def test_data_that_cannot_say_its_tokens_is_unknown_and_says_why():
    assert count_train_tokens(DataLoader(Stream(), batch_size=4)) == (
        None,
        "the training data is an IterableDataset (Stream), which has no length",
    )
    floats = torch.utils.data.TensorDataset(torch.randn(10, 3, 8, 8))
    tokens, why = count_train_tokens(DataLoader(floats))
    assert tokens is None and "torch.float32 values, not integer token ids" in why
    assert count_train_tokens({"a": DataLoader(Windows(10)), "b": DataLoader(Windows(5))})[0] == 15 * 16  # summed


def test_reading_samples_leaves_every_random_state_as_it_was():
    class Noisy(Windows):
        def __getitem__(self, i):
            torch.rand(3), random.random(), np.random.rand()  # a dataset that augments at random
            return super().__getitem__(i)

    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    expected = (torch.rand(2).tolist(), random.random(), np.random.rand())
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    count_train_tokens(DataLoader(Noisy(40)))
    assert (torch.rand(2).tolist(), random.random(), np.random.rand()) == expected


def test_parameters_count_tied_weights_once():
    model = tiny_lit()
    by_hand = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert count_parameters(model) == by_hand
    assert run_scale(model, None, unique_tokens=10).counted == "given: unique_tokens="
    assert run_scale(model, None).missing == "the trainer has no training dataloader"


def _fit(tmp_path, data, **options) -> SaturationMonitor:
    pl.seed_everything(0, verbose=False)
    monitor = SaturationMonitor(window=3, verbose=False, **options)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*no logger.*")
        trainer(tmp_path, max_steps=3, callbacks=[monitor]).fit(tiny_lit(), data)
    return monitor


def test_the_card_places_the_run_or_says_how_to_give_its_tokens(tmp_path):
    data = Windows(64)  # 64 samples x 16 tokens, no overlap: 1,024 unique tokens
    params = sum(p.numel() for p in tiny_lit().parameters())
    placed = _fit(tmp_path, DataLoader(data, batch_size=4))
    card = placed.card()
    assert (
        f"Phase diagram: {params:,} parameters, {len(data.positions()):,} unique training tokens (64 samples x 16 "
        f"tokens in Windows): {len(data.positions()) / params:.3g} tokens per parameter."
    ) in card
    assert "The study's cells span 64M-1.3B parameters" in card and "fewer parameters than the smallest" in card
    # the scale travels as data with the verdict (never read back from the card's text)
    f = placed.verdict.planned_forecast
    assert (f["params"], f["unique_tokens"]) == (params, 1024)

    given = _fit(tmp_path, DataLoader(data, batch_size=4), unique_tokens=5_000_000).card()
    assert "5,000,000 unique training tokens (given: unique_tokens=)" in given

    blind = _fit(tmp_path, DataLoader(Stream(), batch_size=4))
    unknown = blind.card()
    assert (
        "unique training tokens unknown (the training data is an IterableDataset (Stream), which has no length): pass "
        "SaturationMonitor(unique_tokens=N)" in unknown
    )
    assert (blind.verdict.planned_forecast["params"], blind.verdict.planned_forecast["unique_tokens"]) == (params, None)


def test_a_resumed_run_keeps_one_phase_diagram_line(tmp_path):
    data = DataLoader(Windows(64), batch_size=4)
    pl.seed_everything(0, verbose=False)
    first = SaturationMonitor(window=6, verbose=False)
    t = trainer(tmp_path, max_steps=3, callbacks=[first], enable_checkpointing=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*no logger.*")
        t.fit(tiny_lit(), data)
        t.save_checkpoint(tmp_path / "mid.ckpt")
        second = SaturationMonitor(window=6, verbose=False)
        trainer(tmp_path, max_steps=6, callbacks=[second]).fit(tiny_lit(), data, ckpt_path=tmp_path / "mid.ckpt")
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=True)["callbacks"]["SaturationMonitor"]["notes"]
    # the resume brings the saved line back: it is replaced, not added
    assert sum(RunScale.is_note(n) for n in saved) == 1
    assert second.card().count("Phase diagram:") == 1


def test_the_unique_tokens_have_one_name_and_the_old_one_warns():
    """``unique_tokens`` everywhere (satmon.forecast's name); ``train_tokens`` is a deprecated alias of it."""
    import satmon
    from satmon._compat import SatmonDeprecationWarning
    from satmon.settings import Settings

    with pytest.warns(
        SatmonDeprecationWarning, match="train_tokens= is deprecated since satmon 0.5: use unique_tokens="
    ):
        old = SaturationMonitor(train_tokens=1234)
    assert old.settings.unique_tokens == 1234 and Settings(unique_tokens=1234) == old.settings
    with pytest.warns(SatmonDeprecationWarning, match="Settings.train_tokens is deprecated"):
        assert old.settings.train_tokens == 1234
    with pytest.raises(ValueError, match="got both"):
        satmon.Screen(train_tokens=1, unique_tokens=2)
    with pytest.warns(SatmonDeprecationWarning, match="RunScale.train_tokens"):
        assert RunScale(10, 20).train_tokens == 20
