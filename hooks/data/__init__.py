"""Data: one pass over a worker's shard per epoch, with the epoch's end visible.

Owns EpochInput (its driver hook calls the EpochListeners), the one-batch look-ahead, the
input-graph helpers and the determinism checks a mid-epoch resume relies on. Imports the
bottom layer, hooks.config and hooks.faults.
"""
