"""``satmon.probe(model, batches)``: one frozen forward pass over calibration batches that reads
saturation, gamma^-1 dead-direction alignment and the residual stream's sigma_min (its passes, its
targets and its memory plan). The function itself is :func:`satmon.probe`
(:func:`satmon.probing.passes.probe`)."""

from typing import Any


def __getattr__(name: str) -> Any:
    from satmon import _compat  # a name of satmon 0.2's satmon.probing module

    return _compat.moved_attribute(__name__, name)
