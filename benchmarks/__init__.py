"""Benchmark commands (issue 2): `python -m benchmarks.bench_queue`, each figure beside plain SQL."""
