"""Runnable examples: `python -m examples.local_cluster` is the main job."""
