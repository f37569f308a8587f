"""Benchmarking ways of reading: datasets, task builders, runner, metrics, judge and report."""
