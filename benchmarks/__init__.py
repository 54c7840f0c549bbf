"""Benchmarks, calibration and their reports; run as modules from the repository root
(``python -m benchmarks.bench_swiglu``). Research probes that are not the product live in
``benchmarks/research/``."""
