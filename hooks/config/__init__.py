"""Configuration: the cluster, settings, flags and the checks run before any step.

Owns the ClusterConfig (TF_CONFIG or classic flags), EpochSyncSettings, the absl flags and
their EPOCHSYNC_* variables, each setting's source (argument > flag > variable > default), the
generated flag table, the TensorFlow version check and the preflight checks of a session's hooks
and datasets. Imports only the bottom layer
(hooks.errors, hooks.log, hooks.graph_keys).
"""
