"""Checkpoint formats, one module each: :mod:`~satmon.replaying.formats.torch_file` (``torch.save`` files,
Lightning checkpoints), :mod:`~satmon.replaying.formats.safetensors`, :mod:`~satmon.replaying.formats.hf_folder`
(Hugging Face folders), :mod:`~satmon.replaying.formats.dcp` (torch.distributed.checkpoint folders) and
:mod:`~satmon.replaying.formats.deepspeed` (named, not read), each exposing ``FORMAT`` of the shape in
:mod:`~satmon.replaying.formats.common`. The list of formats, in the order they are tried, is
:data:`satmon.replaying.checkpoints.FORMATS`.

Adding a format: a module here whose ``FORMAT`` is a
:class:`~satmon.replaying.formats.common.CheckpointFormat` (``recognise``, ``inspect`` returning a
:class:`~satmon.replaying.formats.common.CheckpointInfo` whose ``weights`` subclass
:class:`~satmon.replaying.formats.common.Weights` with ``meta()`` and ``tensors()``), and its line in ``FORMATS``.
"""
