"""The work queue's state on ps:0 and its one run, the claim: saved with the model, exactly once.

The state is one int64 vector on ps:0 (in every checkpoint; hooks.workqueue.layout says where
each field is): the epoch it belongs to, the epoch's order of the units (a permutation drawn from the seed
and the epoch, or the units' order), the next position to hand out, and per unit its owner, the
owner's batch count when it took the unit, its batches and examples once the owner finished
it, and the batches a resumed mid-epoch checkpoint already held (skip); per worker, how many
claims it made this epoch and the unit of its last one.

A claim is one run on ps:0 alone (its feeds travel in the request, its result in the answer:
no partition on the worker), inside a `tf.CriticalSection`, so claims never interleave:
  - the first claim of a new epoch starts the epoch's queue (order, next 0, no owners);
  - the claim records the unit the worker finished (batches, examples), then hands out the next
    unit of the order (-1: none left), as the worker's claim number `seq`;
  - a claim whose `seq` was already answered (its answer was lost: a deadline, a rejected
    request) answers the same unit again and changes nothing;
  - the answer is [unit, its skip].
With `elastic`, a claim that finds no unit left while another worker's unit is still in flight
answers WAIT (that unit may come back: its worker may die), and the chief's `reclaim` puts the
unit in flight of a worker it found dead back at the head of the queue, after the batches the
model holds, and fences the worker: its later claims answer FENCED (hooks.elastic).
With `elastic` each of a worker's steps also passes the queue's gate, and the chief's reclaim
and a relaunched worker's join run in the same critical section (hooks.workqueue.elastic_graph;
each claim sets the worker's `gated` count to its epoch batch count).
The chief's `assign` (in the same critical section) writes a whole resumed state before the
run starts (hooks.checkpoint.unit_resume).
A claim computes the whole new state from the old and writes it with one assign. No run in the
lock is ever cancelled (hooks.workqueue.claims): TensorFlow's lock lets a second run in beside
the one holding it once a run waiting for it is cancelled. A claim whose worker the state
holds fewer claims of than its `seq` (a write was lost all the same) answers LOST_WRITE.

Typical usage (hooks.workqueue.claims runs it):
  ops = build(num_units=64, num_workers=4, seed=7, shuffle=True, ps_device="/job:ps/task:0")
  unit, skip = session.run(ops.claim, {ops.epoch: 0, ops.worker: 1, ops.seq: 0,
                                       ops.at_batch: 0, ops.finished: -1,
                                       ops.finished_batches: 0, ops.finished_examples: 0})
"""

import dataclasses
import functools
from typing import Dict

import tensorflow as tf

from hooks import graph_keys
from hooks.errors import ConfigError
from hooks.workqueue import elastic_graph
from hooks.workqueue.elastic_graph import (CLOSED, FULL, JOINED, NOT_FENCED, MembershipOps,
                                           ReclaimOps, gate)
from hooks.workqueue.layout import MAX_WORKERS, Layout, fingerprint_value
from hooks.workqueue.state_ops import (ANY, FENCE_MARK, FENCED, LOST_WRITE, NONE, STALE, WAIT,
                                       execute_unrecorded, fills, put)

__all__ = ["QueueOps", "ReclaimOps", "MembershipOps", "Layout", "build", "gate", "STALE",
           "LOST_WRITE",
           "JOINED", "NOT_FENCED", "CLOSED", "FULL", "WAIT", "FENCED", "FENCE_MARK",
           "ANY", "NONE", "MAX_WORKERS", "fingerprint_value"]

_v1 = tf.compat.v1


@dataclasses.dataclass(frozen=True)
class QueueOps:
  """The claim's placeholders and result, the chief's read of the whole state, and the
  chief's write of a resumed state (hooks.workqueue.resume)."""
  epoch: tf.Tensor
  worker: tf.Tensor
  seq: tf.Tensor
  at_batch: tf.Tensor
  finished: tf.Tensor
  finished_batches: tf.Tensor
  finished_examples: tf.Tensor
  wanted: tf.Tensor          # ANY (default), NONE, or a unit not handed out yet (a replay)
  claim: tf.Tensor           # int64 [2]: the unit handed out (-1 none left, STALE), its skip
  state: Dict[str, tf.Tensor]  # Layout.parts of the state (epoch, next, order, owner, ...)
  vector: tf.Tensor          # the whole state vector
  new_vector: tf.Tensor      # placeholder: a whole state vector for `assign`
  assign: tf.Tensor          # writes new_vector (the chief, before the run starts)
  layout: "Layout"
  reclaim: "ReclaimOps | None" = None  # with elastic: the chief's reclaim of a lost worker's unit
  lock: "tf.CriticalSection | None" = None  # with elastic: the claims' lock, for `gate`
  gated: "tf.Variable | None" = None  # with elastic: per worker, its batches that passed `gate`
  state_variable: "tf.Variable | None" = None  # the variable `vector` reads
  membership: "MembershipOps | None" = None  # with elastic: a relaunched worker's rejoin
  closed: "tf.Variable | None" = None  # with elastic: per worker, the last epoch it is closed
  accepted: "tf.Variable | None" = None  # with elastic: per worker, its batches in the model
  joined_by: "tf.Variable | None" = None  # with elastic: per worker, its joining process's token
  done: "tf.Variable | None" = None  # with elastic: per worker, its admitted steps done


def build(num_units: int, num_workers: int, seed: int, shuffle: bool,
          ps_device: str, fingerprint: str = "0", elastic: bool = False) -> QueueOps:
  """The queue's variable on `ps_device` and its claim, for `num_units` units; with `elastic`
  the claim may answer WAIT or FENCED, and the chief's reclaim is built."""
  if num_workers > MAX_WORKERS:
    raise ConfigError(f"a work queue serves at most {MAX_WORKERS} workers, not {num_workers}: "
                      "use static shards (EpochInput over a dataset) for a larger job")
  layout = Layout(num_units)
  with _v1.device(ps_device), tf.name_scope("epochsync_workqueue"):
    # A claim writes the whole vector with one assign.
    state = _v1.get_variable(
        "epochsync/workqueue/state", [layout.size], tf.int64,
        _v1.constant_initializer(-1), trainable=False, use_resource=True)
    _v1.add_to_collection(graph_keys.STATE_VARIABLES, state)
    feeds = {name: _v1.placeholder(tf.int64, [], name) for name in (
        "epoch", "worker", "seq", "at_batch", "finished", "finished_batches",
        "finished_examples")}
    feeds["wanted"] = _v1.placeholder_with_default(tf.constant(ANY, tf.int64), [], "wanted")
    lock = tf.CriticalSection(name="lock", shared_name="epochsync_workqueue_lock")
    order_of = functools.partial(_order, num_units, seed, shuffle)
    gated, closed, joined_by, accepted = (
        [elastic_graph.per_worker(*v) for v in elastic_graph.VARIABLES] if elastic
        else (None,) * len(elastic_graph.VARIABLES))
    # (elastic) per worker, its admitted steps done (elastic_graph.apply_if_member): in no
    # collection, never saved; each run's start resets it
    done = None
    if elastic:
      done = _v1.Variable(tf.zeros([MAX_WORKERS], tf.int64), trainable=False, collections=[],
                          use_resource=True, name="epochsync/workqueue/done")
      _v1.add_to_collection(graph_keys.RESET_OPS, done.initializer)
    claim = functools.partial(_claim, state, feeds, layout, order_of,
                              fingerprint_value(fingerprint), gated)
    result = execute_unrecorded(lock, claim)
    vector = state.read_value()
    new_vector = _v1.placeholder(tf.int64, [layout.size], "new_state")
    assign = execute_unrecorded(lock, functools.partial(_assign, state, new_vector, gated,
                                                        layout))
    reclaim = elastic_graph.reclaim_ops(lock, state, gated, layout) if elastic else None
    membership = (elastic_graph.membership_ops(lock, state, (gated, closed, joined_by), layout)
                  if elastic else None)
    # A new run (a relaunched job) brings every worker back: the chief's reset at the run's
    # start lifts the fences an earlier run left in the state (restored from a checkpoint).
    _v1.add_to_collection(graph_keys.RESET_OPS, execute_unrecorded(
        lock, functools.partial(_lift_fences, state, closed, joined_by, layout)))
  return QueueOps(claim=result, state=layout.parts(vector), vector=vector,
                  new_vector=new_vector, assign=assign, layout=layout, reclaim=reclaim,
                  lock=lock if elastic else None, gated=gated, state_variable=state,
                  membership=membership, closed=closed, accepted=accepted, done=done,
                  joined_by=joined_by, **feeds)


def _assign(state, vector, gated: "tf.Variable | None", layout: Layout) -> tf.Tensor:
  """Writes a whole (resumed) state; with elastic, every worker's gated count starts where the
  resume starts its batch count (a worker that claims nothing in this run, a spare standing
  by, keeps no count of the checkpoint's attempt: the chief's stand-in carries that count)."""
  writes = [state.assign(vector)]
  if gated is not None:
    parts = layout.parts(vector)
    start = parts["epoch"] * graph_keys.EPOCH_SHIFT + parts["resumed_step"]
    writes.append(gated.assign(tf.fill([MAX_WORKERS], start)))
  with tf.control_dependencies(writes):
    return tf.constant(0, tf.int64)


def _lift_fences(state, closed, joined_by, layout: Layout) -> tf.Tensor:
  """Every worker is the run's own process again: no fence, no stand-in, no joiner's token."""
  parts = layout.parts(state.read_value())
  parts["claims"] = tf.where(parts["claims"] <= FENCE_MARK, tf.zeros_like(parts["claims"]),
                             parts["claims"])
  header, fields = layout.join(parts)
  writes = [state.assign(tf.concat([tf.stack(header)] + fields, 0))]
  if closed is not None:
    writes.append(closed.assign(tf.fill([MAX_WORKERS], tf.constant(-1, tf.int64))))
    writes.append(joined_by.assign(tf.zeros([MAX_WORKERS], tf.int64)))
  with tf.control_dependencies(writes):
    return tf.constant(0, tf.int64)


def _order(u: int, seed: int, shuffle: bool, epoch: tf.Tensor) -> tf.Tensor:
  """The epoch's order of the units: a permutation drawn from (seed, epoch), or 0..u-1."""
  if not shuffle:
    return tf.range(u, dtype=tf.int64)
  keys = tf.random.stateless_uniform([u], tf.stack([tf.constant(seed, tf.int64), epoch]),
                                     dtype=tf.float64)
  return tf.cast(tf.argsort(keys, stable=True), tf.int64)


def _bring_wanted(order, position, wanted, u: int):
  """(the order with unit `wanted` swapped to `position`, whether a unit is there for the
  claim). ANY: the order as it is; NONE: no unit; a unit already handed out: no unit (the
  chief's audit then names the units never handed out)."""
  matches = tf.equal(order, wanted)
  at = tf.argmax(tf.cast(matches, tf.int64), output_type=tf.int64)
  left = position < u
  movable = tf.logical_and(tf.reduce_any(matches), at >= position)
  here = tf.minimum(position, u - 1)
  swapped = tf.tensor_scatter_nd_update(order, tf.reshape(tf.stack([here, at]), [2, 1]),
                                        tf.stack([order[at], order[here]]))
  specific = wanted >= 0
  order = tf.where(tf.logical_and(specific, tf.logical_and(left, movable)), swapped, order)
  has_unit = tf.logical_and(left, tf.where(specific, movable, tf.equal(wanted, ANY)))
  return order, has_unit


def _claim(state, feeds, layout: Layout, order_of, fingerprint: int,
           gated: "tf.Variable | None") -> tf.Tensor:
  """The claim's graph (inside the lock): the new state from the old, one assign, the answer."""
  u, old = layout.units, state.read_value()
  epoch = feeds["epoch"]
  fresh = old[0] < epoch  # the epoch's first claim starts its queue
  old_claims = layout.parts(old)["claims"]
  started = tf.concat([
      tf.stack([epoch, tf.constant(0, tf.int64), tf.constant(fingerprint, tf.int64),
                tf.constant(0, tf.int64), tf.constant(0, tf.int64)]),
      order_of(epoch), fills(-1, u), fills(0, u), fills(-1, u), fills(-1, u), fills(0, u),
      tf.where(old_claims <= FENCE_MARK, old_claims, tf.zeros_like(old_claims)),  # fences stay
      fills(-1, MAX_WORKERS)], 0)
  parts = layout.parts(tf.where(fresh, started, old))
  worker, position = feeds["worker"], parts["next"]
  stale = parts["epoch"] > epoch
  fenced = parts["claims"][worker] <= FENCE_MARK
  new = tf.logical_and(tf.equal(parts["claims"][worker], feeds["seq"]), tf.logical_not(stale))
  finished = tf.logical_and(new, feeds["finished"] >= 0)
  order, has_unit = _bring_wanted(parts["order"], position, feeds["wanted"], u)
  unit = tf.where(has_unit, tf.gather(order, tf.minimum(position, u - 1)),
                  tf.constant(-1, tf.int64))
  take = tf.logical_and(new, has_unit)
  skip_of = lambda i: tf.where(i >= 0, tf.gather(parts["skip"], tf.maximum(i, 0)),
                               tf.constant(0, tf.int64))
  written = dict(parts)
  written["next"] = tf.where(take, position + 1, position)
  written["order"] = tf.where(take, order, parts["order"])
  written["owner"] = put(parts["owner"], unit, worker, take)
  written["first_batch"] = put(parts["first_batch"], unit, feeds["at_batch"] - skip_of(unit),
                                take)
  written["batches"] = put(parts["batches"], feeds["finished"], feeds["finished_batches"],
                            finished)
  written["examples"] = put(parts["examples"], feeds["finished"], feeds["finished_examples"],
                             finished)
  written["claims"] = put(parts["claims"], worker, feeds["seq"] + 1, new)
  elastic = gated is not None
  if elastic:  # None left, one in flight: claim again (it may come back) instead of ending.
    handed = tf.range(u, dtype=tf.int64) < written["next"]
    in_flight = tf.gather(written["batches"], written["order"]) < 0
    waits = tf.logical_and(unit < 0, tf.reduce_any(tf.logical_and(handed, in_flight)))
    unit = tf.where(tf.logical_and(waits, tf.equal(feeds["wanted"], ANY)),
                    tf.constant(WAIT, tf.int64), unit)
  written["last"] = put(parts["last"], worker, unit, new)
  header, fields = layout.join(written)
  # The worker was answered more claims than the queue holds: a write to the state was lost.
  lost = parts["claims"][worker] < feeds["seq"]
  # FENCED first: a frozen worker woken after the queue moved on is fenced, not a stray process.
  answer = tf.where(fenced, tf.constant(FENCED, tf.int64),
                    tf.where(stale, tf.constant(STALE, tf.int64),
                             tf.where(lost, tf.constant(LOST_WRITE, tf.int64),
                                      tf.where(new, unit, parts["last"][worker]))))
  # WAIT's second field is the queue's progress (units finished, handed out): a waiting
  # worker sees it move while the units in flight end or come back.
  second = skip_of(answer)
  if elastic:
    done = tf.reduce_sum(tf.cast(written["batches"] >= 0, tf.int64))
    second = tf.where(tf.equal(answer, WAIT), done * (u + 1) + written["next"], second)
  writes = [state.assign(tf.concat([tf.stack(header)] + fields, 0))]
  if elastic:  # The gate counts on from the worker's epoch batch count at its claim.
    counted = tf.logical_and(new, tf.logical_not(fenced))
    writes.append(gated.scatter_nd_update([[worker]], tf.reshape(tf.where(
        counted, epoch * graph_keys.EPOCH_SHIFT + feeds["at_batch"], gated[worker]), [1])))
  with tf.control_dependencies(writes):
    return tf.stack([tf.identity(answer), second])
