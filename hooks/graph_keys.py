"""Graph collection names through which tf-epochsync's pieces find each other's ops.

The epoch hooks (barrier, done) run what other pieces (e.g. the sync optimizer) put in
these collections, so each piece works alone and they compose without knowing each other.

Typical usage:
  tf.compat.v1.add_to_collection(graph_keys.DONE_OPS, my_done_marker_op)
  # WorkerDoneHook runs every op in DONE_OPS once per epoch, when this worker's shard ends.
"""

__all__ = ["DONE_OPS", "EPOCH_START_OPS", "GATED_TASKS", "RESET_OPS", "STATE_VARIABLES",
           "STEP_GATES", "STEP_MARKERS", "STEP_START_OPS", "SYNC_TRAIN_OPS"]

# Ops each worker runs once per epoch right after its shard for the epoch is exhausted
# (immediately at epoch start for an empty shard), before it arrives at the epoch barrier.
DONE_OPS = "epochsync_done_ops"

# Ops each worker runs at the start of every epoch (after the start or epoch_end barrier
# released it, before its first step of the epoch), e.g. refreshing a local step. They run in
# the run that starts the epoch's first pass, which runs again when TensorFlow rejected it as a
# duplicate request on any task: their stateful ops must be on the worker's own task.
EPOCH_START_OPS = "epochsync_epoch_start_ops"

# Ops the chief runs once at the start of every run, before any task uses the ps-side queues
# and accumulators (RunStartHook): they drain what an earlier run on the same long-lived ps
# tasks left behind (arrivals, releases, markers, tokens, half-accumulated gradients).
RESET_OPS = "epochsync_reset_ops"

# tf-epochsync's own saved variables (completed epochs, done counters, progress, step
# counters). A checkpoint that lacks them (written by a stock job) or holds them with another
# worker count still restores: the chief restores every model variable and starts these fresh.
STATE_VARIABLES = "epochsync_state_variables"

# The train_op of every WorkerDoneSyncReplicasOptimizer in the graph: EpochInput.hook refuses a
# session that runs one without its SafeSyncTokensHook (the step would wait forever).
SYNC_TRAIN_OPS = "epochsync_sync_train_ops"

# Stateful ops of a training step that do not wait for the step's batch by themselves (e.g. the
# sync optimizer's GRAD marker, sent before the gradients): EpochInput makes each wait for its
# input read, which waits for every ps (hooks.data.step_gate), so a step that TensorFlow
# rejected on any task ran none of them and can run again.
STEP_START_OPS = "epochsync_step_start_ops"

# The tasks ("ps:0", ...) whose partition of a training step gates its stateful ops
# (hooks.data.step_gate); hooks.faults.step_retry retries a step any of them rejected.
GATED_TASKS = "epochsync_gated_tasks"

# The gate's ops (one timestamp per gated task: hooks.data.step_gate), and the ops that wait for
# them besides the input read: the StuckStepWatchdog's step marker, so that a marker still
# behind means the step's stateful ops never ran (its part here, or a gated task's, never
# started). Whichever of the two is built second adds the control edges.
STEP_GATES = "epochsync_step_gates"
STEP_MARKERS = "epochsync_step_markers"

# A worker's count of applied batches (asynchronous; hooks.checkpoint.mid_epoch's `applied`):
# epoch * EPOCH_SHIFT + the batches applied in that epoch.
EPOCH_SHIFT = 2**32


def batches_in_epoch(applied: int, epoch: int) -> int:
  """The batches an applied count holds of `epoch` (0 if it is of another epoch)."""
  return applied % EPOCH_SHIFT if applied // EPOCH_SHIFT == epoch else 0
