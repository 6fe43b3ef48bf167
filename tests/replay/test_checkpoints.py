"""Checkpoint reading: weights_only=True unless trusted, one read per file, real Lightning and satmon
checkpoints load without the opt-in, non-checkpoints are named for what they are not."""

from __future__ import annotations

import builtins
import fractions
import os
import subprocess
import warnings
import zipfile

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import tiny_lit, token_loader, trainer
from satmon import SaturationMonitor
from satmon.replaying.checkpoints import (
    TRUST_FLAG,
    CheckpointInfo,
    inspect_checkpoint,
    order_checkpoints,
    state_dict_of,
)
from satmon.replaying.listing import (
    find_checkpoints,
    list_checkpoints,
    nothing_to_replay,
)
from satmon.replaying.user_code import ReplayUsageError, short


class Payload:
    """Unpickling this runs ``exec``: one line appended to ``marker`` per load (the evidence
    that code from a file ran)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'a').write('ran\\n')",)


def runs(marker) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


@pytest.fixture(scope="module")
def lightning_ckpt(tmp_path_factory):
    """A real Lightning checkpoint of a run with satmon's callback (its state is in the file too)."""
    root = tmp_path_factory.mktemp("ckpt")
    ckpt = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1)
    monitor = SaturationMonitor(window=2, verbose=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*no logger.*|.*does not have many workers.*")
        trainer(root, max_steps=2, enable_checkpointing=True, callbacks=[ckpt, monitor]).fit(
            tiny_lit(), token_loader(2)
        )
    (path,) = root.glob("*.ckpt")
    return path


@pytest.fixture
def count_loads(monkeypatch):
    """Counts torch.load calls (each one is a read of a file, and a run of any code in its pickle)."""
    calls = []
    real = torch.load

    def counting(f, *a, **kw):
        calls.append((str(f), kw.get("weights_only")))
        return real(f, *a, **kw)

    monkeypatch.setattr(torch, "load", counting)
    return calls


def test_lightning_and_satmon_checkpoint_loads_without_trust_in_one_read(lightning_ckpt, count_loads):
    info = inspect_checkpoint(lightning_ckpt)
    assert info.error is None and info.weights_only and not info.refused
    assert info.kind == "lightning" and info.global_step == 2
    assert info.hparams["d_model"] == 32 and info.hparams_name == "kwargs"
    assert any("SaturationMonitor" in k for k in info.checkpoint["callbacks"])  # satmon's own state was read too
    assert count_loads == [(str(lightning_ckpt), True)]
    sd = state_dict_of(info)  # from what inspection loaded: no second read
    assert len(count_loads) == 1
    want = torch.load(lightning_ckpt, weights_only=True)["state_dict"]
    assert sd.keys() == want.keys() and all(torch.equal(sd[k], want[k]) for k in want)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-pickle"])
@pytest.mark.parametrize("suffix", [".ckpt", ".pt"])
def test_payload_never_runs_without_trust_and_runs_once_with_it(lightning_ckpt, tmp_path, count_loads, suffix, legacy):
    marker = tmp_path / "marker"
    ckpt = torch.load(lightning_ckpt, weights_only=True)
    obj = ckpt if suffix == ".ckpt" else {"model": {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}}
    obj["extra"] = Payload(marker)
    path = tmp_path / f"crafted{suffix}"
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    count_loads.clear()

    info = inspect_checkpoint(path)
    assert runs(marker) == 0
    assert info.refused and info.unsafe and info.checkpoint is None
    # the global is named, called unsafe, and trusting the file is not advised
    assert "refused by torch.load(weights_only=True)" in info.error and "GLOBAL exec" in info.error
    assert "runs Python code: not safe to allow" in info.error and TRUST_FLAG not in info.error

    trusted = inspect_checkpoint(path, trust=True)
    assert runs(marker) == 1  # the index is read once, so the payload ran once
    assert (
        trusted.error is None
        and not trusted.weights_only
        and trusted.kind == ("lightning" if suffix == ".ckpt" else "state_dict")
    )
    state_dict_of(trusted)
    # a zip archive's tensors are copied from the file without unpickling it again; a legacy file keeps its
    # tensors inside the pickle stream, so it is read again at its turn (and its code runs again)
    assert runs(marker) == 1 + legacy
    assert [wo for _, wo in count_loads] == [True, False] + [False] * legacy


def test_a_custom_type_is_refused_with_its_name_and_registering_it_as_safe_loads_it(lightning_ckpt, tmp_path):
    ckpt = torch.load(lightning_ckpt, weights_only=True)
    ckpt["hyper_parameters"]["ratio"] = fractions.Fraction(1, 3)
    torch.save(ckpt, tmp_path / "frac.ckpt")
    info = inspect_checkpoint(tmp_path / "frac.ckpt")
    assert "fractions.Fraction" in info.error and TRUST_FLAG in info.error
    with torch.serialization.safe_globals([fractions.Fraction]):  # the API user's way to allow their own safe type
        info = inspect_checkpoint(tmp_path / "frac.ckpt")
    assert info.error is None and info.hparams["ratio"] == fractions.Fraction(1, 3)


def test_non_checkpoints_are_named_for_what_they_are_not(lightning_ckpt, tmp_path, count_loads):
    files = {
        "notes.ckpt": b"step 100: loss 2.31\n",
        "empty.pt": b"",
        "random.pth": bytes([7, 0, 255, 1]) * 64,
        "data.ckpt": None,  # a zip archive, but not torch.save's
        "half.ckpt": lightning_ckpt.read_bytes()[:2000],
        "bad.safetensors": b"\x00" * 32,
    }
    for name, data in files.items():
        if data is None:
            with zipfile.ZipFile(tmp_path / name, "w") as z:
                z.writestr("readme.txt", "hello")
        else:
            (tmp_path / name).write_bytes(data)
    torch.save([torch.zeros(2)], tmp_path / "batches.pt")
    count_loads.clear()
    errors = {p.name: inspect_checkpoint(p).error for p in tmp_path.iterdir()}
    assert errors["notes.ckpt"] == "not a PyTorch checkpoint: a text file (starts 'step 100: loss 2.31')"
    assert errors["empty.pt"] == "not a PyTorch checkpoint: an empty file"
    assert errors["random.pth"].startswith("not a PyTorch checkpoint: neither a torch.save zip archive nor a pickle")
    assert errors["data.ckpt"] == "not a PyTorch checkpoint: a zip archive without the data.pkl of torch.save"
    assert errors["half.ckpt"].startswith("truncated or corrupt")
    assert errors["bad.safetensors"] == "not a safetensors file: no JSON header"
    assert (
        errors["batches.pt"].startswith("not a checkpoint: expected a state_dict")
        and "got list" in errors["batches.pt"]
    )
    assert [f for f, _ in count_loads] == [str(tmp_path / "batches.pt")]  # the others never reached the unpickler


def test_safetensors_header_at_inspection_tensors_when_built(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    weights = {"w": torch.randn(3, 2), "b": torch.arange(3.0)}
    safetensors.save_file(weights, str(tmp_path / "w.safetensors"))
    info = inspect_checkpoint(tmp_path / "w.safetensors", trust=True)
    assert info.error is None and info.weights_only and info.global_step is None and info.checkpoint is None
    assert any("no global step" in n for n in info.notes)
    got = state_dict_of(info)
    assert got.keys() == weights.keys() and all(torch.equal(got[k], weights[k]) for k in weights)


def test_step_from_plain_checkpoints(tmp_path):
    torch.save({"model": {"w": torch.zeros(1)}, "iter_num": torch.tensor(40)}, tmp_path / "nano.pt")
    torch.save({"w": torch.zeros(1)}, tmp_path / "bare.pt")
    assert inspect_checkpoint(tmp_path / "nano.pt").global_step == 40
    assert inspect_checkpoint(tmp_path / "bare.pt").global_step is None


def test_find_expands_folders_in_natural_order_and_excludes(tmp_path):
    for name in ("s10.ckpt", "s9.ckpt", "calib.pt", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    found = find_checkpoints([tmp_path], exclude=[tmp_path / "calib.pt"])
    assert [p.name for p in found] == ["s9.ckpt", "s10.ckpt"]


def test_order_by_step_and_last_ckpt_dropped(tmp_path):
    infos = [
        CheckpointInfo(tmp_path / n, "lightning", s)
        for n, s in [("last.ckpt", 20), ("b.ckpt", 20), ("a.ckpt", 10), ("nostep.pt", None), ("last-v1.ckpt", 30)]
    ]
    infos.append(CheckpointInfo(tmp_path / "broken.ckpt", error="x"))
    assert [i.path.name for i in order_checkpoints(infos)] == ["a.ckpt", "b.ckpt", "last-v1.ckpt", "nostep.pt"]


# ------------------------------------------------------------------------------------ listing
def _touch_ckpt(path, step: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"w": torch.zeros(2)}, "iter_num": step}, path)


def test_symlinked_folders_are_followed_loops_detected_each_real_file_once(tmp_path):
    real = tmp_path / "store"
    _touch_ckpt(real / "a.pt", 1)
    _touch_ckpt(real / "b.pt", 2)
    run = tmp_path / "run"
    _touch_ckpt(run / "c.pt", 3)
    (run / "checkpoints").symlink_to(real, target_is_directory=True)  # a run folder whose checkpoints/ is a link
    (real / "up").symlink_to(tmp_path, target_is_directory=True)  # a loop back above both
    (real / "again.pt").symlink_to(real / "a.pt")  # a second name for a.pt
    (real / "dangling.pt").symlink_to(tmp_path / "nowhere.pt")
    listing = list_checkpoints([run, real / "b.pt"])
    names = sorted(p.name for p in listing.paths)
    assert names == ["a.pt", "b.pt", "c.pt"]  # each real file once, through the link; no loop
    why = {p.name: w for p, w in listing.left_out}
    assert why["again.pt"].startswith("the same file as") and why["dangling.pt"].startswith("a broken symlink (to ")
    assert any("already searched" in w for w in why.values())
    assert listing.explicit == [(real / "b.pt", f"the same file as {run / 'checkpoints' / 'b.pt'} (a link)")]
    assert all(listing.stamps[p][0].size == p.stat().st_size for p in listing.paths)


def test_hugging_face_folders_are_one_checkpoint_and_trainer_state_is_not_listed(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    for step in (2, 4):
        folder = tmp_path / "out" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        st.save_file({"w": torch.full((2,), float(step))}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}, "log_history": []}}')
        for side in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "rng_state_1.pth", "scaler.pt"):
            torch.save({"state": {}}, folder / side)
        (folder / "training_args.bin").write_bytes(b"\x80\x02")
    (tmp_path / "out" / "notes.txt").write_text("hi")
    listing = list_checkpoints([tmp_path / "out"])
    assert [p.name for p in listing.paths] == ["checkpoint-2", "checkpoint-4"]
    assert [p.name for p, _ in listing.left_out] == ["notes.txt"]  # the Trainer's files belong to their folder
    infos = [inspect_checkpoint(p, stamps=listing.stamps[p]) for p in listing.paths]
    assert [(i.error, i.global_step, i.hf, i.kind) for i in infos] == [
        (None, 2, True, "state_dict"),
        (None, 4, True, "state_dict"),
    ]
    assert state_dict_of(infos[1])["w"].tolist() == [4.0, 4.0]
    only = list_checkpoints([tmp_path / "out" / "checkpoint-2" / "rng_state.pth"])
    assert only.paths == [] and "not model weights" in only.explicit[0][1]
    assert "not model weights" in nothing_to_replay(["x"], only) and "--trust" not in nothing_to_replay(["x"], only)


def test_nothing_to_replay_says_what_was_found_instead(tmp_path):
    (tmp_path / "calib.pt").write_bytes(b"x")
    (tmp_path / "log.txt").write_text("x")
    with pytest.raises(
        ReplayUsageError,
        match=r"Nothing to replay under .*found calib.pt \(the --data file\), "
        r"log.txt \(not .ckpt/.pt/.pth/.safetensors\)",
    ):
        find_checkpoints([tmp_path], exclude=[tmp_path / "calib.pt"])


@pytest.mark.parametrize(
    ("payload", "global_name", "does"),
    [
        (lambda: (os.system, ("true",)), "posix.system", "runs a shell command"),
        (lambda: (subprocess.Popen, (["true"],)), "Popen", "runs a shell command"),
        (lambda: (eval, ("1",)), "eval", "runs Python code"),
        (lambda: (builtins.__import__, ("os",)), "__import__", "imports and runs modules"),
    ],
)
def test_a_global_that_runs_code_is_named_unsafe_and_never_advised(tmp_path, payload, global_name, does):
    class Crafted:
        def __reduce__(self):
            return payload()

    torch.save({"state_dict": {"w": torch.zeros(1)}, "global_step": 1, "x": Crafted()}, tmp_path / "p.ckpt")
    info = inspect_checkpoint(tmp_path / "p.ckpt")
    assert info.refused and info.unsafe
    assert global_name in info.error and f"which {does}: not safe to allow" in info.error
    assert TRUST_FLAG not in info.error and "add_safe_globals" not in info.error


def test_a_plain_type_is_named_with_both_ways_to_load_it(tmp_path):
    torch.save({"model": {"w": torch.zeros(1)}, "cfg": fractions.Fraction(1, 3)}, tmp_path / "f.pt")
    info = inspect_checkpoint(tmp_path / "f.pt")
    assert info.refused and not info.unsafe
    assert "GLOBAL fractions.Fraction, a type not on torch's allow-list" in info.error
    assert TRUST_FLAG in info.error and "add_safe_globals([fractions.Fraction])" in info.error


def test_crafted_deep_hyper_parameters_inspect_without_recursion(tmp_path, lightning_ckpt):
    """A 60,000-deep nested list (written as flat pickle opcodes) in the datamodule's hyper-parameters."""
    ckpt = torch.load(lightning_ckpt, weights_only=True)
    ckpt["datamodule_hyper_parameters"] = {"seq_len": 16, "blob": "MARKER"}
    torch.save(ckpt, tmp_path / "src.ckpt")
    with zipfile.ZipFile(tmp_path / "src.ckpt") as zi, zipfile.ZipFile(tmp_path / "deep.ckpt", "w") as zo:
        for item in zi.infolist():
            data = zi.read(item.filename)
            if item.filename.endswith("data.pkl"):
                data = data.replace(b"X\x06\x00\x00\x00MARKER", b"]" * 60_000 + b"a" * 59_999)
            zo.writestr(item.filename, data)
    info = inspect_checkpoint(tmp_path / "deep.ckpt")
    assert info.error is None and info.global_step == 2
    blob, depth = info.datamodule_hparams["blob"], 0
    while isinstance(blob, list) and blob:
        blob, depth = blob[0], depth + 1
    assert depth == 59_999
    assert short(info.datamodule_hparams) == "{'seq_len': 16, 'blob': [[...]]}"
    assert state_dict_of(info).keys() == ckpt["state_dict"].keys()  # a rewritten archive reads from its directory
