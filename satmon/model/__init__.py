"""Reading a model's structure: which modules normalise (found by what they compute), their
effective gain and bias, their blocks, and which DyT feeds which gated MLP (traced data flow, names
as a fallback that may say "unknown", never "no"). No hooks that count, no Lightning."""
