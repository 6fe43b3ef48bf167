"""Reading a model's structure, once: :func:`satmon.model.map.model_map` holds every normaliser (found by
what it computes: the point-wise family, LayerNorm and RMSNorm, on any axis), its block, and where its
output goes (a traced forward, :mod:`satmon.model.dataflow`); :mod:`satmon.model.affine` reads a layer's
effective gain and bias from its current values; :mod:`satmon.model.gating` reads which DyT feeds which gated MLP (the
trace, or names and forward source as a fallback that may say "unknown", never "no"). No hooks that
count, no Lightning."""
