"""Benchmark commands, such as `python -m benchmarks.bench_queue`: each figure beside plain SQL."""
