"""The package version: the one place it is written (pyproject.toml reads it).

The autotune cache is keyed by it: a new version measures again."""

__version__ = "0.3.0"
