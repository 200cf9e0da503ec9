"""Benchmarks against stock TensorFlow, run side by side in one process tree."""
