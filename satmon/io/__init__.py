"""Everything that leaves satmon as a file or a log: the TensorBoard sink and reader, JSON records,
markdown reports and plots. Fed from the typed results in :mod:`satmon.results`."""
