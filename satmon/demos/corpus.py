"""An embedded corpus that needs no download: the text of Python's own standard library.

Every Python install ships its standard library as source, so the demo, the tests and the
examples train on real, structured text (byte-level, vocabulary 256) without fetching anything.
The corpus differs slightly between Python versions; within one install it is deterministic.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

__all__ = ["corpus_tokens", "torch_source_tokens", "torch_source_identity", "WindowDataset", "CorpusDataModule"]

_CACHE: dict[int, Tensor] = {}
_TORCH: dict[str, Any] = {}


def _torch_blob() -> bytes:
    if "blob" not in _TORCH:
        root = Path(torch.__path__[0])
        paths = sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
        _TORCH["blob"] = b"".join(p.read_bytes() for p in paths)
        _TORCH["files"] = len(paths)
    return _TORCH["blob"]


def torch_source_tokens() -> Tensor:
    """Every ``*.py`` file of the installed torch package (sorted by path under ``torch.__path__[0]``),
    concatenated, as int64 byte tokens: a larger corpus (about 46 MB for torch 2.x) that one torch
    version reproduces exactly (:func:`torch_source_identity` says which).

    Example:
        >>> t = torch_source_tokens()
        >>> t.dtype, t.numel() > 10_000_000
        (torch.int64, True)
    """
    if "tokens" not in _TORCH:
        _TORCH["tokens"] = torch.frombuffer(bytearray(_torch_blob()), dtype=torch.uint8).to(torch.int64)
    return _TORCH["tokens"]


def torch_source_identity() -> dict[str, Any]:
    """The torch corpus's identity: torch's version, the file count, the byte count and the SHA-256.

    Example:
        >>> sorted(torch_source_identity())
        ['corpus_bytes', 'corpus_files', 'corpus_sha256', 'torch']
    """
    import hashlib

    blob = _torch_blob()
    if "sha" not in _TORCH:
        _TORCH["sha"] = hashlib.sha256(blob).hexdigest()
    return {
        "torch": torch.__version__,
        "corpus_files": _TORCH["files"],
        "corpus_bytes": len(blob),
        "corpus_sha256": _TORCH["sha"],
    }


def corpus_tokens(n_bytes: int = 2_000_000) -> Tensor:
    """The first ``n_bytes`` bytes of the standard library's ``*.py`` files (sorted by name), as int64 tokens.

    Example:
        >>> t = corpus_tokens(1000)
        >>> t.shape, t.dtype, int(t.max()) < 256
        (torch.Size([1000]), torch.int64, True)
    """
    if n_bytes <= 0:
        raise ValueError(f"Expected n_bytes > 0, got {n_bytes}.")
    if n_bytes not in _CACHE:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        chunks, size = [], 0
        for path in sorted(stdlib.glob("*.py")):
            data = path.read_bytes()
            chunks.append(data)
            size += len(data)
            if size >= n_bytes:
                break
        blob = b"".join(chunks)[:n_bytes]
        if len(blob) < n_bytes:
            raise RuntimeError(f"Expected {n_bytes} bytes of standard-library text, found {len(blob)} under {stdlib}.")
        _CACHE[n_bytes] = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(torch.int64)
    return _CACHE[n_bytes]


class WindowDataset(Dataset):
    """Fixed, non-overlapping ``(input, target)`` windows of ``seq_len`` tokens."""

    def __init__(self, tokens: Tensor, seq_len: int) -> None:
        n = (tokens.numel() - 1) // seq_len
        if n < 1:
            raise ValueError(f"Expected at least {seq_len + 1} tokens for seq_len={seq_len}, got {tokens.numel()}.")
        self.tokens, self.seq_len, self.n = tokens, seq_len, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        s = i * self.seq_len
        chunk = self.tokens[s : s + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


try:
    import lightning.pytorch as pl

    class CorpusDataModule(pl.LightningDataModule):
        """Train/validation windows of the embedded corpus.

        Args:
            seq_len: tokens per sequence.
            batch_size: sequences per batch.
            train_tokens: size of the training split (the regime knob: few tokens, repeated for many
                epochs, is the over-parameterised regime; many tokens the data-rich one).
            val_tokens: size of the held-out split (taken after the training split).
            seed: shuffling seed.
        """

        def __init__(
            self,
            seq_len: int = 64,
            batch_size: int = 16,
            train_tokens: int = 400_000,
            val_tokens: int = 40_000,
            seed: int = 0,
        ) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
            self.train_tokens, self.val_tokens = train_tokens, val_tokens

        def setup(self, stage: str | None = None) -> None:
            tokens = corpus_tokens(self.train_tokens + self.val_tokens)
            self.train_set = WindowDataset(tokens[: self.train_tokens], self.seq_len)
            self.val_set = WindowDataset(tokens[self.train_tokens :], self.seq_len)

        def train_dataloader(self) -> DataLoader:
            g = torch.Generator().manual_seed(self.seed)
            return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, generator=g, drop_last=True)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(self.val_set, batch_size=self.batch_size)

except ImportError:  # pragma: no cover - lightning is a dependency; keep the core importable without it
    pass
