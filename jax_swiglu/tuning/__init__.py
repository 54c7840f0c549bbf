"""Tuning on the local GPU: ``measure`` times candidate launches (natively and through JAX),
``autotune`` picks the fastest for a user's calls and stores it in the autotune cache, which
the selection reads first. ``python -m jax_swiglu.tune`` is its command line; the offline
calibration that writes the shipped tuning data is ``benchmarks/calibrate.py``."""
