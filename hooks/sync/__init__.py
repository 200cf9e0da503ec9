"""Synchronous training: the worker-done optimizer, its tokens and its aggregation.

Owns WorkerDoneSyncReplicasOptimizer (its arguments and the aggregation graph), the
SafeSyncTokensHook with the chief's aggregation thread, the AggregationGroup of several such
optimizers, the per-worker done counter and the step counter. Imports the layers below it
(bottom, config, faults, data, epoch); never hooks.checkpoint or hooks.session.
"""
