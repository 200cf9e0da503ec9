"""Epochs: the start of a run, the epoch barrier, and what the chief records per epoch.

Owns the RunStartHook (a clean ps for every run), the EpochBarrierHook and its ps-side graph,
the audit file, per-epoch progress lines and TensorBoard summaries. Imports the bottom
layer, hooks.config, hooks.faults and hooks.data.
"""
