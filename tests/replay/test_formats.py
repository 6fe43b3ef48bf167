"""Checkpoint formats, one module each behind one shape: the list is the only place a format is chosen, and a new
format is one module plus its line in the list (and its name in the import beside it), tried on a copy of satmon:
the replay, its listing and its loaders use it, no other file changed."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import satmon
from satmon.replaying import checkpoints
from satmon.replaying.formats.common import CheckpointFormat, Weights

PACKAGE = Path(satmon.__file__).parent

#: A format satmon does not have: weights as JSON lists, the step beside them. One module, as a user would write it.
DUMMY = '''
"""A dummy format: ``.jsonw`` files, ``{"step": N, "weights": {name: nested lists}}``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from satmon.replaying.file_info import FileStamp
from satmon.replaying.formats.common import CheckpointFormat, CheckpointInfo, Match, Weights


@dataclass(frozen=True)
class JsonWeights(Weights):
    def meta(self):
        return {k: torch.empty(v.shape, device="meta") for k, v in self.index.items()}

    def tensors(self):
        self.stamp.check()
        return {k: torch.tensor(v) for k, v in json.loads(self.stamp.path.read_text())["weights"].items()}


def recognise(path, entries):
    return Match() if entries is None and path.suffix == ".jsonw" else None


def inspect(path, trust=False, stamps=None):
    stamp = stamps[0] if stamps else FileStamp.of(path)
    stored = json.loads(Path(path).read_text())
    index = {k: torch.tensor(v) for k, v in stored["weights"].items()}
    return CheckpointInfo(path=path, global_step=stored["step"], format="json weights",
                          weights=(JsonWeights(stamp, index, "json"),))


FORMAT = CheckpointFormat("json weights", recognise, inspect, (".jsonw",))
'''


def _dispatches_on_a_format_name(tree: ast.AST) -> list[int]:
    """Lines that compare a layout or format attribute with a string (``w.layout == "zip"``...)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [n for n in [node.left, *node.comparators] if isinstance(n, ast.Attribute)]
            strings = [n for n in [node.left, *node.comparators] if isinstance(n, (ast.Constant, ast.Tuple))]
            if any(n.attr in ("layout", "format") for n in names) and strings:
                found.append(node.lineno)
    return found


def test_every_format_has_the_shape_and_only_the_list_chooses_one():
    assert [f.name for f in checkpoints.FORMATS] == [
        "torch.distributed.checkpoint folder",
        "DeepSpeed folder",
        "Hugging Face folder",
        "torch",
        "safetensors",
    ]
    assert all(isinstance(f, CheckpointFormat) for f in checkpoints.FORMATS)
    for path in (PACKAGE / "replaying").rglob("*.py"):
        outside = path.parent.name != "formats" or path.name in ("common.py", "__init__.py")
        if outside:  # a format's own module may look at its own layouts; nothing else dispatches on one
            assert _dispatches_on_a_format_name(ast.parse(path.read_text())) == [], path


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_path_no_format_recognises_is_left_out_or_said(tmp_path, kind):
    if kind == "file":
        (tmp_path / "notes.txt").write_text("x")
        assert checkpoints.recognise(tmp_path / "notes.txt", None) is None
    else:
        (tmp_path / "empty").mkdir()
        info = checkpoints.inspect_checkpoint(tmp_path / "empty")
        assert info.error.startswith("not a checkpoint: a folder in none of the formats satmon reads")


def test_weights_of_every_format_give_meta_and_real_tensors_alike(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    w = torch.arange(6.0).reshape(2, 3)
    torch.save({"state_dict": {"w": w}, "global_step": 4, "pytorch-lightning_version": "2"}, tmp_path / "a.ckpt")
    st.save_file({"w": w}, str(tmp_path / "b.safetensors"))
    hf = tmp_path / "checkpoint-7"
    hf.mkdir()
    torch.save({"w": w}, hf / "pytorch_model.bin")
    for path in (tmp_path / "a.ckpt", tmp_path / "b.safetensors", hf):
        info = checkpoints.inspect_checkpoint(path)
        assert info.error is None and all(isinstance(x, Weights) for x in info.weights), path
        meta, real = checkpoints.meta_state_dict(info), checkpoints.state_dict_of(info)
        assert meta["w"].is_meta and meta["w"].shape == w.shape and torch.equal(real["w"], w), path
    assert [
        checkpoints.inspect_checkpoint(p).format for p in (tmp_path / "a.ckpt", tmp_path / "b.safetensors", hf)
    ] == ["torch", "safetensors", "Hugging Face folder"]


def test_a_new_format_is_one_module_and_one_line_and_the_replay_uses_it(tmp_path):
    """On a copy of satmon: add ``formats/json_weights.py`` and its line in ``FORMATS``; a folder of ``.jsonw`` files
    is listed, inspected, ordered, loaded and probed like any other, by ``satmon.replay`` and the command line."""
    copy = tmp_path / "copy"
    shutil.copytree(PACKAGE, copy / "satmon", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "satmon" / "replaying" / "formats" / "json_weights.py").write_text(DUMMY)  # the module
    listed = copy / "satmon" / "replaying" / "checkpoints.py"
    text = listed.read_text()
    imports, entry = "from satmon.replaying.formats import dcp, deepspeed, hf_folder, ", "    safetensors.FORMAT,\n"
    assert text.count(imports) == 1 and text.count(entry) == 1
    text = text.replace(imports, imports + "json_weights, ")  # its name in the import
    listed.write_text(text.replace(entry, entry + "    json_weights.FORMAT,\n"))  # its line in FORMATS
    runs = tmp_path / "runs"
    runs.mkdir()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    for step in (20, 10):
        state = {k: (v + step).tolist() for k, v in net.state_dict().items()}
        (runs / f"s{step}.jsonw").write_text(json.dumps({"step": step, "weights": state}))
    torch.save([torch.randn(8, 4)], tmp_path / "calib.pt")
    build = tmp_path / "build.py"
    build.write_text(
        "import torch\n\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))\n"
    )
    script = textwrap.dedent(f"""
        import satmon, torch
        from satmon.replaying.checkpoints import CHECKPOINT_SUFFIXES
        assert satmon.__file__.startswith({str(copy)!r}) and ".jsonw" in CHECKPOINT_SUFFIXES
        build = lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        run = satmon.replay({str(runs)!r}, factory=build, data={str(tmp_path / "calib.pt")!r}, twin=False, device="cpu",
                            on_note=None)
        print([(r.global_step, r.error, r.report.layers["1"].kind) for r in run], [i.format for i in run.infos])
    """)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[(10, None, 'layernorm'), (20, None, 'layernorm')] ['json weights', 'json weights']"
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "satmon.cli.main",
            "replay",
            str(runs),
            "--factory",
            f"{build}:build",
            "--data",
            str(tmp_path / "calib.pt"),
            "--no-twin",
            "--device",
            "cpu",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "Replayed 2 of 2 checkpoint(s)" in cli.stdout
