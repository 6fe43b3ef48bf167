"""satmon's version, importable without importing anything else."""

__version__ = "0.5.0"
