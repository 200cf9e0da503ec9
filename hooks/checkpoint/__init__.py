"""Checkpoints: the chief's save after each epoch, mid-epoch saves, and restoring them.

Owns ChiefSaveAfterBarrierHook, the mid-epoch save, restore and resume (every worker skips
what the checkpoint holds) and the partial restore of a checkpoint that lacks tf-epochsync's
state. Imports the layers below it (bottom, config, faults, data, epoch); never hooks.sync
(a sync hook is passed in) or hooks.session.
"""
