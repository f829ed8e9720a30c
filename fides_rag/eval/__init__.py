"""Evaluation on top of the core: datasets, metrics and benchmarks."""
