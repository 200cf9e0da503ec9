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
With `elastic` each of a worker's steps also passes the queue's `gate` (in the same critical
section, in the step's run, before the batch reaches the model): it counts the batch as the
worker's (`gated`, set to the worker's epoch batch count by each claim) unless the worker is
fenced, and then fails the step; the reclaim takes the unit back after the gated batches. So a
batch counts in the model exactly when it passed the gate, whether its worker froze before or
after (hooks.elastic).
The chief's `assign` (in the same critical section) writes a whole resumed state before the
run starts (hooks.checkpoint.unit_resume).
A claim computes the whole new state from the old and writes it with one assign, so a claim
cancelled by its deadline (TensorFlow stops a cancelled run between two ops) changed all of it
or nothing, and its retry learns which: no unit is lost or handed out twice.

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
from hooks.errors import FENCED_MARK, ConfigError
from hooks.workqueue.layout import MAX_WORKERS, Layout, fingerprint_value

__all__ = ["QueueOps", "ReclaimOps", "MembershipOps", "Layout", "build", "gate", "STALE",
           "JOINED", "NOT_FENCED", "CLOSED", "WAIT", "FENCED", "FENCE_MARK",
           "ANY", "NONE", "MAX_WORKERS", "fingerprint_value"]

_v1 = tf.compat.v1
STALE = -2  # a claim's answer: the queue is already in a later epoch than the claim's
WAIT = -3  # (elastic) none left to hand out, but a unit in flight may come back: claim again
FENCED = -4  # (elastic) the chief found this worker lost and took its unit back
FENCE_MARK = -2  # claims[w] <= FENCE_MARK: worker w is fenced (a fresh epoch keeps the mark)
ANY, NONE = -1, -2  # a claim's `wanted`: the next unit of the order, or none (a replay's end)


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


@dataclasses.dataclass(frozen=True)
class MembershipOps:
  """(Elastic) Who arrives at an epoch's barrier for a lost worker, decided in the queue's lock.

  `closed`: per worker, the last epoch the chief arrives for it (a stand-in; -1 none): the
  epoch it was lost in and every epoch it is still fenced at the gather. `join` (a relaunched
  worker, at `epoch`): JOINED lifts its fence if the chief arrives for it at no barrier from
  `epoch` on, and it arrives itself from then on; NOT_FENCED: the chief has not found its
  earlier process lost yet; CLOSED: `epoch`'s barrier is the chief's (wait for a later one).
  `token` (the joining process's, random): a join run again after its answer was lost answers
  JOINED again.
  `still_lost` (the chief, at `epoch`'s barrier): whether the worker is still fenced; if so
  the epoch is closed to its join, and the chief arrives for it."""
  epoch: tf.Tensor
  worker: tf.Tensor
  token: tf.Tensor
  join: tf.Tensor
  still_lost: tf.Tensor


JOINED, NOT_FENCED, CLOSED = 1, 0, 2


@dataclasses.dataclass(frozen=True)
class ReclaimOps:
  """The chief's reclaim (elastic): fenced worker `worker`'s unit in flight in `epoch` goes back
  to the head of the queue after the batches of it that passed the worker's gate. `result`:
  [the unit (-1: none in flight), its new skip, its skip before (the new minus the old: the
  lost worker's batches of it in the model), the worker's epoch batches in the model]."""
  epoch: tf.Tensor
  worker: tf.Tensor
  result: tf.Tensor


def _execute_unrecorded(lock: tf.CriticalSection, fn):
  """lock.execute(fn), minus the graph collection entry it leaves (the lock runs only this
  fn; the entry cannot be serialized: every meta-graph export would warn about it)."""
  graph = _v1.get_default_graph()
  key = "critical_section_executions"
  before = list(graph.get_collection(key))
  result = lock.execute(fn)
  entries = graph.get_collection_ref(key)
  entries[:] = [e for e in entries if any(e is b for b in before)]
  return result


def build(num_units: int, num_workers: int, seed: int, shuffle: bool,
          ps_device: str, fingerprint: str = "0", elastic: bool = False) -> QueueOps:
  """The queue's variable on `ps_device` and its claim, for `num_units` units; with `elastic`
  the claim may answer WAIT or FENCED, and the chief's reclaim is built."""
  if num_workers > MAX_WORKERS:
    raise ConfigError(f"a work queue serves at most {MAX_WORKERS} workers, not {num_workers}: "
                      "use static shards (EpochInput over a dataset) for a larger job")
  layout = Layout(num_units)
  with _v1.device(ps_device), tf.name_scope("epochsync_workqueue"):
    # A claim writes the whole vector with one assign: a claim cancelled half-way (its
    # deadline) changed all of it or nothing.
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
    gated = _per_worker("epochsync/workqueue/gated", 0) if elastic else None
    closed = _per_worker("epochsync/workqueue/closed", -1) if elastic else None
    joined_by = _per_worker("epochsync/workqueue/joined_by", 0) if elastic else None
    claim = functools.partial(_claim, state, feeds, layout, order_of,
                              fingerprint_value(fingerprint), gated)
    result = _execute_unrecorded(lock, claim)
    vector = state.read_value()
    new_vector = _v1.placeholder(tf.int64, [layout.size], "new_state")
    assign = _execute_unrecorded(lock, functools.partial(_assign, state, new_vector))
    reclaim = _reclaim_ops(lock, state, gated, closed, layout) if elastic else None
    membership = (_membership_ops(lock, state, (gated, closed, joined_by), layout)
                  if elastic else None)
    # A new run (a relaunched job) brings every worker back: the chief's reset at the run's
    # start lifts the fences an earlier run left in the state (restored from a checkpoint).
    _v1.add_to_collection(graph_keys.RESET_OPS, _execute_unrecorded(
        lock, functools.partial(_lift_fences, state, closed, layout)))
  return QueueOps(claim=result, state=layout.parts(vector), vector=vector,
                  new_vector=new_vector, assign=assign, layout=layout, reclaim=reclaim,
                  lock=lock if elastic else None, gated=gated, state_variable=state,
                  membership=membership, **feeds)


def _per_worker(name: str, initial: int) -> tf.Variable:
  """(elastic) A per-worker int64 vector of the queue's, used only inside its lock:
  `gated` (epoch * EPOCH_SHIFT + the worker's epoch batch count: set by each claim, one more
  per batch that passed the gate) and `closed` (MembershipOps). In checkpoints like the rest
  of the state, though each run sets them again (its claims, its reset)."""
  var = _v1.get_variable(name, [MAX_WORKERS], tf.int64, _v1.constant_initializer(initial),
                         trainable=False, use_resource=True)
  _v1.add_to_collection(graph_keys.STATE_VARIABLES, var)
  return var


def gate(ops: QueueOps, worker_id: int, after: tf.Operation) -> tf.Operation:
  """(elastic) The op a step of worker `worker_id` runs before its batch reaches the model,
  after `after` (the step's take of the batch): one run of the lock on ps:0 that counts the
  batch as the worker's, or, if the chief fenced the worker, fails the step with
  InvalidArgumentError carrying `errors.FENCED_MARK` (hooks.faults.step_retry turns it into
  WorkerFencedError)."""
  with _v1.device(ops.gated.device), tf.name_scope("epochsync_workqueue_gate"):
    with tf.control_dependencies([after]):
      passed = _execute_unrecorded(
          ops.lock, functools.partial(_pass_gate, ops.state_variable, ops.gated, ops.layout,
                                      worker_id))
    return tf.debugging.Assert(passed, [tf.constant(
        f"{FENCED_MARK}: worker id {worker_id}, found lost by the chief")], name="fence")


def _assign(state, vector) -> tf.Tensor:
  with tf.control_dependencies([state.assign(vector)]):
    return tf.constant(0, tf.int64)


def _lift_fences(state, closed, layout: Layout) -> tf.Tensor:
  parts = layout.parts(state.read_value())
  parts["claims"] = tf.where(parts["claims"] <= FENCE_MARK, tf.zeros_like(parts["claims"]),
                             parts["claims"])
  header, fields = layout.join(parts)
  writes = [state.assign(tf.concat([tf.stack(header)] + fields, 0))]
  if closed is not None:
    writes.append(closed.assign(tf.fill([MAX_WORKERS], tf.constant(-1, tf.int64))))
  with tf.control_dependencies(writes):
    return tf.constant(0, tf.int64)


def _order(u: int, seed: int, shuffle: bool, epoch: tf.Tensor) -> tf.Tensor:
  """The epoch's order of the units: a permutation drawn from (seed, epoch), or 0..u-1."""
  if not shuffle:
    return tf.range(u, dtype=tf.int64)
  keys = tf.random.stateless_uniform([u], tf.stack([tf.constant(seed, tf.int64), epoch]),
                                     dtype=tf.float64)
  return tf.cast(tf.argsort(keys, stable=True), tf.int64)


def _fills(value: int, n: int) -> tf.Tensor:
  return tf.fill([n], tf.constant(value, tf.int64))


def _put(vector, index, value, when):
  """`vector` with [index] = value where `when` (index clipped at 0 otherwise)."""
  index = tf.maximum(index, 0)
  return tf.where(when, tf.tensor_scatter_nd_update(
      vector, tf.reshape(index, [1, 1]), tf.reshape(value, [1])), vector)


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


def _pass_gate(state, gated, layout: Layout, worker_id: int) -> tf.Tensor:
  """The gate's graph (inside the lock): whether worker `worker_id` is not fenced; if not, its
  gated count rises by one."""
  passed = layout.parts(state.read_value())["claims"][worker_id] > FENCE_MARK
  count = gated.scatter_nd_add([[worker_id]], tf.reshape(tf.cast(passed, tf.int64), [1]))
  with tf.control_dependencies([count]):
    return tf.identity(passed)


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
      order_of(epoch), _fills(-1, u), _fills(0, u), _fills(-1, u), _fills(-1, u), _fills(0, u),
      tf.where(old_claims <= FENCE_MARK, old_claims, tf.zeros_like(old_claims)),  # fences stay
      _fills(-1, MAX_WORKERS)], 0)
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
  written["owner"] = _put(parts["owner"], unit, worker, take)
  written["first_batch"] = _put(parts["first_batch"], unit, feeds["at_batch"] - skip_of(unit),
                                take)
  written["batches"] = _put(parts["batches"], feeds["finished"], feeds["finished_batches"],
                            finished)
  written["examples"] = _put(parts["examples"], feeds["finished"], feeds["finished_examples"],
                             finished)
  written["claims"] = _put(parts["claims"], worker, feeds["seq"] + 1, new)
  elastic = gated is not None
  if elastic:  # None left, one in flight: claim again (it may come back) instead of ending.
    handed = tf.range(u, dtype=tf.int64) < written["next"]
    in_flight = tf.gather(written["batches"], written["order"]) < 0
    waits = tf.logical_and(unit < 0, tf.reduce_any(tf.logical_and(handed, in_flight)))
    unit = tf.where(tf.logical_and(waits, tf.equal(feeds["wanted"], ANY)),
                    tf.constant(WAIT, tf.int64), unit)
  written["last"] = _put(parts["last"], worker, unit, new)
  header, fields = layout.join(written)
  answer = tf.where(stale, tf.constant(STALE, tf.int64),
                    tf.where(fenced, tf.constant(FENCED, tf.int64),
                             tf.where(new, unit, parts["last"][worker])))
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


def _reclaim_ops(lock: tf.CriticalSection, state, gated, closed,
                 layout: Layout) -> ReclaimOps:
  feeds = {name: _v1.placeholder(tf.int64, [], "reclaim_" + name) for name in ("epoch", "worker")}
  result = _execute_unrecorded(lock, functools.partial(_reclaim, state, gated, closed, feeds,
                                                       layout))
  return ReclaimOps(result=result, **feeds)


def _membership_ops(lock: tf.CriticalSection, state, per_worker,
                    layout: Layout) -> MembershipOps:
  feeds = {name: _v1.placeholder(tf.int64, [], "member_" + name)
           for name in ("epoch", "worker", "token")}
  join = _execute_unrecorded(lock, functools.partial(_join, state, per_worker, feeds, layout))
  still_lost = _execute_unrecorded(lock, functools.partial(_still_lost, state, per_worker[1],
                                                           feeds, layout))
  return MembershipOps(join=join, still_lost=still_lost, **feeds)


def _join(state, per_worker, feeds, layout: Layout) -> tf.Tensor:
  """The join's graph (inside the lock): JOINED (the fence lifted, the worker's claims and gated
  count start at `epoch`; or this token's join already did), NOT_FENCED or CLOSED (nothing
  changes)."""
  gated, closed, joined_by = per_worker
  parts = layout.parts(state.read_value())
  worker, epoch = feeds["worker"], feeds["epoch"]
  fenced = parts["claims"][worker] <= FENCE_MARK
  again = tf.logical_and(tf.logical_not(fenced), tf.equal(joined_by[worker], feeds["token"]))
  open_ = tf.logical_and(closed[worker] < epoch, parts["epoch"] <= epoch)
  joins = tf.logical_and(fenced, open_)
  written = dict(parts)
  written["claims"] = _put(parts["claims"], worker, tf.constant(0, tf.int64), joins)
  written["last"] = _put(parts["last"], worker, tf.constant(-1, tf.int64), joins)
  header, fields = layout.join(written)
  count = tf.where(joins, epoch * graph_keys.EPOCH_SHIFT, gated[worker])
  token = tf.where(joins, feeds["token"], joined_by[worker])
  writes = [state.assign(tf.concat([tf.stack(header)] + fields, 0)),
            gated.scatter_nd_update([[worker]], tf.reshape(count, [1])),
            joined_by.scatter_nd_update([[worker]], tf.reshape(token, [1]))]
  with tf.control_dependencies(writes):
    return tf.where(tf.logical_or(joins, again), tf.constant(JOINED, tf.int64),
                    tf.where(fenced, tf.constant(CLOSED, tf.int64),
                             tf.constant(NOT_FENCED, tf.int64)))


def _still_lost(state, closed, feeds, layout: Layout) -> tf.Tensor:
  """(inside the lock) Whether the worker is still fenced; if so, `epoch` closes to its join."""
  worker, epoch = feeds["worker"], feeds["epoch"]
  lost = layout.parts(state.read_value())["claims"][worker] <= FENCE_MARK
  last = tf.where(lost, tf.maximum(closed[worker], epoch), closed[worker])
  with tf.control_dependencies([closed.scatter_nd_update([[worker]], tf.reshape(last, [1]))]):
    return tf.identity(lost)


def _reclaim(state, gated, closed, feeds, layout: Layout) -> tf.Tensor:
  """The reclaim's graph (inside the lock): fence the worker; its unit in flight, if any, goes
  to position next - 1 (the head of what is left) with next one less, its skip the batches of
  it that passed the worker's gate. Run twice, the second finds nothing in flight: it changes
  nothing more."""
  parts = layout.parts(state.read_value())
  worker, position = feeds["worker"], parts["next"]
  count = gated[worker]
  held = tf.where(tf.equal(count // graph_keys.EPOCH_SHIFT, feeds["epoch"]),
                  count % graph_keys.EPOCH_SHIFT, tf.constant(0, tf.int64))
  unit = parts["last"][worker]
  safe = tf.maximum(unit, 0)
  back = tf.logical_and(tf.logical_and(unit >= 0, tf.equal(parts["epoch"], feeds["epoch"])),
                        tf.logical_and(tf.equal(tf.gather(parts["owner"], safe), worker),
                                       tf.gather(parts["batches"], safe) < 0))
  skip = tf.maximum(held - tf.gather(parts["first_batch"], safe), 0)
  at = tf.argmax(tf.cast(tf.equal(parts["order"], unit), tf.int64), output_type=tf.int64)
  head = tf.maximum(position - 1, 0)
  swapped = tf.tensor_scatter_nd_update(parts["order"], tf.reshape(tf.stack([head, at]), [2, 1]),
                                        tf.stack([parts["order"][at], parts["order"][head]]))
  written = dict(parts)
  written["order"] = tf.where(back, swapped, parts["order"])
  written["next"] = tf.where(back, position - 1, position)
  written["owner"] = _put(parts["owner"], unit, tf.constant(-1, tf.int64), back)
  written["first_batch"] = _put(parts["first_batch"], unit, tf.constant(0, tf.int64), back)
  written["skip"] = _put(parts["skip"], unit, skip, back)
  claims = parts["claims"][worker]
  written["claims"] = _put(parts["claims"], worker, FENCE_MARK - tf.maximum(claims, 0),
                           claims > FENCE_MARK)
  written["last"] = _put(parts["last"], worker, tf.constant(-1, tf.int64), back)
  header, fields = layout.join(written)
  old_skip = tf.gather(parts["skip"], safe)
  none = tf.constant(-1, tf.int64), tf.constant(0, tf.int64), tf.constant(0, tf.int64)
  writes = [state.assign(tf.concat([tf.stack(header)] + fields, 0)),  # the epoch is the chief's
            closed.scatter_nd_update([[worker]], tf.reshape(tf.maximum(closed[worker],
                                                                       feeds["epoch"]), [1]))]
  with tf.control_dependencies(writes):
    return tf.stack([tf.where(back, a, b) for a, b in zip((unit, skip, old_skip), none)] +
                    [held])
