"""satmon's version, importable without importing anything else."""

__version__ = "0.4.0"
