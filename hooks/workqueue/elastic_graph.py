"""The work queue's elastic runs (hooks.elastic): the gates, the reclaim and the membership.

An asynchronous step's apply runs in its worker's own lock (`apply_in_worker_lock`, built by
hooks.sync.elastic_apply.ElasticOptimizer): once every gradient of the step is on its ps task,
the lock is taken, the worker's membership checked (not fenced, and this process the slot's
member: `identity`), the gradients applied and the batch counted (`gated`), so a batch counts
exactly when it is in the model, and a step whose worker was fenced while it computed (a frozen
worker woken) applies nothing. The chief fences a lost worker (`fence`), then takes its lock
once (`drain`: an apply under way, which waits for nothing but the ps tasks, ends first) before
the reclaim reads its count. No lock is shared by two workers' steps.

The rest runs inside the queue's lock, beside its claims (hooks.workqueue.queue_graph):
  - `gate`: each step of an elastic worker whose apply is not in its own lock (an optimizer
    not wrapped, or a synchronous marker: `admit`), before its batch reaches the model: counts
    the batch as the worker's (`gated`), or fails the step of a fenced worker;
  - the chief's reclaim of a lost worker: fences it and puts its unit in flight back at the
    head of the queue after the batches of it that passed the worker's gate;
  - the membership: a relaunched worker's join of the running epoch (its count goes on from its
    earlier process's), against the chief's check at each gather of whether it still arrives
    for the worker (`closed`): never both for one epoch.
So a batch counts in the model exactly when it passed the gate (or its apply, in the worker's
lock), and a woken or relaunched process never trains a batch twice.

Typical usage (queue_graph.build does it with elastic=True; the input adds the gate):
  gated, closed, joined_by, accepted = (per_worker(name, init) for name, init in VARIABLES)
  reclaim = reclaim_ops(lock, state, gated, layout)
  gate_op = gate(queue_ops, worker_id=1, after=take_batch_op)
"""

import dataclasses
import functools
import weakref

import tensorflow as tf

from hooks import graph_keys
from hooks.errors import FENCED_MARK
from hooks.workqueue.layout import MAX_WORKERS, Layout
from hooks.workqueue.state_ops import FENCE_MARK, execute_unrecorded, put

__all__ = ["MembershipOps", "ReclaimOps", "JOINED", "NOT_FENCED", "CLOSED", "FULL", "VARIABLES",
           "per_worker", "gate", "admit", "guest_join", "spares_feed", "still_lost",
           "refuse_fenced", "fenced", "close_fenced", "register", "registered", "reclaim_ops",
           "membership_ops", "worker_lock", "apply_in_worker_lock", "drain",
           "register_asynchronous", "registered_asynchronous", "applies_in_worker_lock",
           "AsynchronousWorker"]

_v1 = tf.compat.v1
# The per-worker vectors of an elastic queue (name, initial value).
VARIABLES = (("epochsync/workqueue/gated", 0), ("epochsync/workqueue/closed", -1),
             ("epochsync/workqueue/joined_by", 0), ("epochsync/workqueue/accepted", 0))


@dataclasses.dataclass(frozen=True)
class MembershipOps:
  """(Elastic) Who arrives at an epoch's barrier for a lost worker, decided in the queue's lock.

  `closed`: per worker, the last epoch the chief arrives for it (a stand-in; -1 none): every
  epoch it is still fenced at the gather. `join` (a relaunched worker or a spare, at the
  running `epoch`): [JOINED, NOT_FENCED, CLOSED or FULL; its earlier process's batches of
  `epoch` in the model]. JOINED
  lifts its fence if the chief arrives for it at no barrier from `epoch` on: it claims units of
  `epoch` at once, its count going on from the batches its earlier process trained, and
  arrives itself; NOT_FENCED: the chief has not found its earlier process lost yet; CLOSED:
  `epoch`'s barrier is the chief's (wait for a later one); FULL: the job has all the workers
  it trains with (no more than `spares` workers are fenced, the spares' own fences included):
  the process stands by as a spare until a worker is lost. `token` (the joining process's,
  random): a join run again after its answer was lost answers JOINED again. `spares`
  (default 0): the job's spare workers (--epochsync_spare_workers).
  `still_lost` (the chief, at `epoch`'s barrier): [1 if the chief arrives for the worker (it
  is still fenced: the epoch closes to its join; or a synchronous guest no step took in,
  guest_join), else 0; its batches of `epoch` in the model, which the chief's arrival
  carries]."""
  epoch: tf.Tensor
  worker: tf.Tensor
  token: tf.Tensor
  spares: tf.Tensor
  join: tf.Tensor
  still_lost: tf.Tensor


JOINED, NOT_FENCED, CLOSED, FULL = 1, 0, 2, 3


@dataclasses.dataclass(frozen=True)
class ReclaimOps:
  """The chief's reclaim (elastic): fenced worker `worker`'s unit in flight in `epoch` goes back
  to the head of the queue after the batches of it that passed the worker's gate. `result`:
  [the unit (-1: none in flight), its new skip, its skip before (the new minus the old: the
  lost worker's batches of it in the model), the worker's epoch batches in the model].
  `fence` (feeds `worker`): the fence alone, run first when the worker's steps apply in its
  own lock: then its `drain`, then `result`."""
  epoch: tf.Tensor
  worker: tf.Tensor
  result: tf.Tensor
  fence: tf.Tensor


def per_worker(name: str, initial: int) -> tf.Variable:
  """A per-worker int64 vector of the queue's (VARIABLES), used only inside its lock: `gated`
  (epoch * EPOCH_SHIFT + the worker's epoch batch count: set by each claim, one more per batch
  that passed the gate), `closed` and `joined_by` (MembershipOps), `accepted` (synchronous:
  epoch * EPOCH_SHIFT + the worker's batches in the model, counted by the aggregation;
  hooks.sync.elastic_steps). In checkpoints like the rest of the state, though each run sets
  them again (its claims, its reset, the sync optimizer's init)."""
  var = _v1.get_variable(name, [MAX_WORKERS], tf.int64, _v1.constant_initializer(initial),
                         trainable=False, use_resource=True)
  _v1.add_to_collection(graph_keys.STATE_VARIABLES, var)
  return var


# The elastic queue of each graph, for a synchronous optimizer built after it (hooks.sync). Not
# a graph collection: every checkpoint save exports the meta graph, and would warn about it.
_QUEUES: "weakref.WeakKeyDictionary[tf.Graph, object]" = weakref.WeakKeyDictionary()


def register(ops) -> None:
  """Makes `ops` (an elastic queue's QueueOps) the current graph's elastic queue."""
  _QUEUES[_v1.get_default_graph()] = ops


def registered():
  """The current graph's elastic queue (its QueueOps), or None."""
  return _QUEUES.get(_v1.get_default_graph())


# The asynchronous elastic queue of each graph, for an ElasticOptimizer built after it
# (hooks.sync.elastic_apply), and the graphs whose step applies in its worker's lock.
_ASYNC_QUEUES: "weakref.WeakKeyDictionary[tf.Graph, object]" = weakref.WeakKeyDictionary()
_APPLIES: "weakref.WeakKeyDictionary[tf.Graph, int]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class AsynchronousWorker:
  """An asynchronous elastic worker's queue (QueueOps), its id and its process's `identity`
  (hooks.workqueue.claims.UnitClaims.identity)."""
  ops: object
  worker_id: int
  identity: tf.Variable


def register_asynchronous(ops, worker_id: int, identity: tf.Variable) -> None:
  """Makes `ops` (an asynchronous elastic queue's QueueOps) the current graph's, for worker
  `worker_id` whose process is `identity`."""
  _ASYNC_QUEUES[_v1.get_default_graph()] = AsynchronousWorker(ops, worker_id, identity)


def registered_asynchronous() -> "AsynchronousWorker | None":
  """The current graph's asynchronous elastic worker (AsynchronousWorker), or None."""
  return _ASYNC_QUEUES.get(_v1.get_default_graph())


def applies_in_worker_lock(graph: tf.Graph) -> int:
  """How many applies of `graph`'s step run in the worker's lock (0: the batch's gate counts)."""
  return _APPLIES.get(graph, 0)


def worker_lock(worker_id: int, device: str) -> tf.CriticalSection:
  """Worker `worker_id`'s own lock, on `device` (shared by name: every task's graph has it)."""
  with _v1.device(device):
    return tf.CriticalSection(name=f"epochsync_worker_lock_{worker_id}",
                              shared_name=f"epochsync_worker_lock_{worker_id}")


def _member(ops, worker_id: int, identity: tf.Tensor) -> tf.Tensor:
  """Whether worker `worker_id` is not fenced and this process (`identity`: 0 for the run's
  own process, its token once it joined) is its slot's member. Reads two words: O(1)."""
  at = ops.layout.slices()["claims"].start + worker_id
  claims = tf.gather(ops.state_variable, at)
  member = tf.gather(ops.joined_by, worker_id)
  return tf.logical_and(claims > FENCE_MARK, tf.equal(member, identity))


def apply_in_worker_lock(ops, worker_id: int, identity: tf.Tensor, inputs, apply_fn
                         ) -> tf.Operation:
  """The step's apply of worker `worker_id` in its own lock, taken once every tensor of
  `inputs` (the step's gradients, each already on its variable's ps task) exists: a member's
  apply (`apply_fn()`, returning an op) then its batch's count; a fenced worker's or a stale
  process's step fails before applying, with InvalidArgumentError carrying
  `errors.FENCED_MARK` (WorkerFencedError)."""
  graph = _v1.get_default_graph()
  _APPLIES[graph] = _APPLIES.get(graph, 0) + 1
  device = ops.gated.device
  lock = worker_lock(worker_id, device)
  with _v1.device(device):  # Read on the ps before the lock, as the gradients are.
    identity = tf.identity(identity, name="epochsync_identity_on_ps")

  def locked():
    passed = _member(ops, worker_id, identity)
    # The apply's own tensors (e.g. a constant learning rate) on the ps too, not the worker's.
    with tf.control_dependencies([refuse_fenced(passed, worker_id)]), _v1.device(device):
      update = apply_fn()
    with tf.control_dependencies([update]):
      counted = ops.gated.scatter_nd_add([[worker_id]], tf.ones([1], tf.int64))
    with tf.control_dependencies([counted]):
      return tf.identity(passed)

  with tf.control_dependencies(list(inputs) + [identity]), tf.name_scope("epochsync_elastic_apply"):
    done = execute_unrecorded(lock, locked)
  return done.op


def drain(ops, worker_id: int) -> tf.Tensor:
  """(The chief) Takes worker `worker_id`'s lock once: an apply under way ends first (it waits
  only for the ps tasks); after a `fence` no apply of it starts again. Returns its count."""
  lock = worker_lock(worker_id, ops.gated.device)
  return execute_unrecorded(lock, lambda: tf.gather(ops.gated, worker_id))


def _fence(state, worker: tf.Tensor, layout: Layout) -> tf.Tensor:
  """(Inside the queue's lock) The chief's fence of `worker` alone; the reclaim that follows
  the worker's drain fences it again (no change) and takes its unit back."""
  parts = layout.parts(state.read_value())
  claims = parts["claims"][worker]
  parts["claims"] = put(parts["claims"], worker, FENCE_MARK - tf.maximum(claims, 0),
                        claims > FENCE_MARK)
  header, fields = layout.join(parts)
  with tf.control_dependencies([state.assign(tf.concat([tf.stack(header)] + fields, 0))]):
    return tf.constant(0, tf.int64)


def admit(ops, worker_id, count: bool = True) -> tf.Tensor:
  """(Inside the queue's lock) Whether worker `worker_id` is not fenced; with `count`, its gated
  count rises by one if so. A synchronous step's marker is admitted this way (hooks.sync)."""
  passed = ops.layout.parts(ops.state_variable.read_value())["claims"][worker_id] > FENCE_MARK
  if not count:
    return passed
  delta = tf.reshape(tf.cast(passed, tf.int64), [1])
  with tf.control_dependencies([ops.gated.scatter_nd_add([[worker_id]], delta)]):
    return tf.identity(passed)


def fenced(ops, num_workers: int) -> tf.Tensor:
  """(Inside the queue's lock) Per worker id < num_workers, whether the chief fenced it."""
  claims = ops.layout.parts(ops.state_variable.read_value())["claims"]
  return claims[:num_workers] <= FENCE_MARK


def close_fenced(ops, epoch: tf.Tensor, num_workers: int) -> tf.Tensor:
  """(Inside the queue's lock) Closes `epoch` to the joins of the fenced workers: the chief
  stands in for them in it (a synchronous epoch's start, hooks.sync.elastic_steps)."""
  closed = ops.closed[:num_workers]
  last = tf.where(fenced(ops, num_workers), tf.maximum(closed, epoch), closed)
  return ops.closed[:num_workers].assign(last)


def gate(ops, worker_id: int, after: tf.Operation,
         enabled: "tf.Tensor | None" = None) -> tf.Operation:
  """The op a step of worker `worker_id` runs before its batch reaches the model,
  after `after` (the step's take of the batch), while `enabled` (a bool on the worker, None:
  always; off where the step applies in the worker's own lock, `apply_in_worker_lock`): one run
  of the lock
  on ps:0 that counts the batch as the worker's, or, if the chief fenced the worker, fails the
  step with InvalidArgumentError carrying `errors.FENCED_MARK` (hooks.faults.step_retry turns it
  into WorkerFencedError). `ops`: the queue's QueueOps, built with elastic=True."""
  with _v1.device(ops.gated.device), tf.name_scope("epochsync_workqueue_gate"):
    with tf.control_dependencies([after]):
      run = lambda: execute_unrecorded(ops.lock, functools.partial(admit, ops, worker_id))
      passed = run() if enabled is None else tf.cond(enabled, run, lambda: tf.constant(True))
    return refuse_fenced(passed, worker_id)


def refuse_fenced(passed: tf.Tensor, worker_id: int) -> tf.Operation:
  """Fails the run unless `passed` (admit's answer): InvalidArgumentError carrying
  `errors.FENCED_MARK`, which hooks.faults.step_retry turns into WorkerFencedError."""
  return tf.debugging.Assert(passed, [tf.constant(
      f"{FENCED_MARK}: worker id {worker_id}, found lost by the chief")], name="fence")


def reclaim_ops(lock: tf.CriticalSection, state, gated, layout: Layout) -> ReclaimOps:
  feeds = {name: _v1.placeholder(tf.int64, [], "reclaim_" + name) for name in ("epoch", "worker")}
  result = execute_unrecorded(lock, functools.partial(_reclaim, state, gated, feeds, layout))
  fence = execute_unrecorded(lock, functools.partial(_fence, state, feeds["worker"], layout))
  return ReclaimOps(result=result, fence=fence, **feeds)


def membership_ops(lock: tf.CriticalSection, state, vectors,
                    layout: Layout) -> MembershipOps:
  feeds = {name: _v1.placeholder(tf.int64, [], "member_" + name)
           for name in ("epoch", "worker", "token")}
  feeds["spares"] = spares_feed("member_spares")
  join = execute_unrecorded(lock, functools.partial(_join, state, vectors, feeds, layout))
  still_lost = execute_unrecorded(lock, functools.partial(_still_lost, state, vectors[0],
                                                           vectors[1], feeds, layout))
  return MembershipOps(join=join, still_lost=still_lost, **feeds)


def spares_feed(name: str) -> tf.Tensor:
  """A join's feed of the job's spare workers (MembershipOps.spares): 0 unless fed."""
  return _v1.placeholder_with_default(tf.constant(0, tf.int64), [], name)


def guest_join(ops, worker: tf.Tensor, epoch: tf.Tensor, token: tf.Tensor,
               allowed: tf.Tensor, spares: tf.Tensor) -> tf.Tensor:
  """(Inside the queue's lock; a synchronous job, hooks.sync.elastic_steps) MembershipOps.join
  for a guest of the steps: it may join `epoch` while the chief would still arrive for it there
  (closed up to `epoch`, and `allowed`: no gather stood in for it yet); `epoch` then stays
  closed, the chief arriving for it, until a step takes it in and opens it."""
  vectors = (ops.gated, ops.closed, ops.joined_by)
  feeds = {"worker": worker, "epoch": epoch, "token": token, "spares": spares}
  return _join(ops.state_variable, vectors, feeds, ops.layout, steps_allow=allowed)


def _join(state, vectors, feeds, layout: Layout, steps_allow: "tf.Tensor | None" = None
          ) -> tf.Tensor:
  """The join's graph (inside the lock): [JOINED (the fence lifted, the worker's claims start
  at `epoch`, its gated count goes on from its earlier process's; or this token's join already
  did), NOT_FENCED, CLOSED or FULL (nothing changes); its earlier process's batches of
  `epoch`]. A synchronous guest (`steps_allow`) as guest_join says."""
  gated, closed, joined_by = vectors
  parts = layout.parts(state.read_value())
  worker, epoch = feeds["worker"], feeds["epoch"]
  fenced = parts["claims"][worker] <= FENCE_MARK
  again = tf.logical_and(tf.logical_not(fenced), tf.equal(joined_by[worker], feeds["token"]))
  open_ = tf.logical_and(closed[worker] < epoch if steps_allow is None else tf.logical_and(
      closed[worker] <= epoch, steps_allow), parts["epoch"] <= epoch)
  # Slots beyond the job's workers are never fenced: the fenced ones are its lost workers and
  # its spares. A process joins in place of one lost beyond the spares.
  room = tf.reduce_sum(tf.cast(parts["claims"] <= FENCE_MARK, tf.int64)) > feeds["spares"]
  joins = tf.logical_and(tf.logical_and(fenced, open_), room)
  written = dict(parts)
  written["claims"] = put(parts["claims"], worker, tf.constant(0, tf.int64), joins)
  written["last"] = put(parts["last"], worker, tf.constant(-1, tf.int64), joins)
  header, fields = layout.join(written)
  token = tf.where(joins, feeds["token"], joined_by[worker])
  writes = [state.assign(tf.concat([tf.stack(header)] + fields, 0)),
            joined_by.scatter_nd_update([[worker]], tf.reshape(token, [1]))]
  if steps_allow is not None:  # The chief arrives for it until a step takes it in.
    writes.append(closed.scatter_nd_update([[worker]], tf.reshape(
        tf.where(joins, tf.maximum(closed[worker], epoch), closed[worker]), [1])))
  with tf.control_dependencies(writes):
    refused = tf.where(tf.logical_and(open_, tf.logical_not(room)),
                       tf.constant(FULL, tf.int64), tf.constant(CLOSED, tf.int64))
    answer = tf.where(tf.logical_or(joins, again), tf.constant(JOINED, tf.int64),
                      tf.where(fenced, refused, tf.constant(NOT_FENCED, tf.int64)))
    return tf.stack([answer, _batches_in(gated[worker], epoch)])


def _batches_in(count: tf.Tensor, epoch: tf.Tensor) -> tf.Tensor:
  """A `gated` count's batches of `epoch` (0 if it counts an earlier epoch's)."""
  return tf.where(tf.equal(count // graph_keys.EPOCH_SHIFT, epoch),
                  count % graph_keys.EPOCH_SHIFT, tf.constant(0, tf.int64))


def still_lost(ops, worker: tf.Tensor, epoch: tf.Tensor) -> tf.Tensor:
  """(Inside the queue's lock) MembershipOps.still_lost's graph, for a synchronous job's own
  check (hooks.sync.elastic_steps: it first cancels a guest's join no step took in yet)."""
  return _still_lost(ops.state_variable, ops.gated, ops.closed,
                     {"worker": worker, "epoch": epoch}, ops.layout)


def _still_lost(state, gated, closed, feeds, layout: Layout) -> tf.Tensor:
  """(inside the lock) [whether the chief arrives for the worker at `epoch`: it is still
  fenced (then `epoch` closes to its join), or its process joined as a guest (synchronous
  training); the worker's batches of `epoch` in the model (its gated count: a guest's goes on
  from its earlier process's)]."""
  worker, epoch = feeds["worker"], feeds["epoch"]
  lost = layout.parts(state.read_value())["claims"][worker] <= FENCE_MARK
  last = tf.where(lost, tf.maximum(closed[worker], epoch), closed[worker])
  with tf.control_dependencies([closed.scatter_nd_update([[worker]], tf.reshape(last, [1]))]):
    return tf.stack([tf.cast(tf.logical_or(lost, last >= epoch), tf.int64),
                     _batches_in(gated[worker], epoch)])


def _reclaim(state, gated, feeds, layout: Layout) -> tf.Tensor:
  """The reclaim's graph (inside the lock): fence the worker; its unit in flight, if any, goes
  to position next - 1 (the head of what is left) with next one less, its skip the batches of
  it that passed the worker's gate. Run twice, the second finds nothing in flight: it changes
  nothing more."""
  parts = layout.parts(state.read_value())
  worker, position = feeds["worker"], parts["next"]
  count = gated[worker]
  held = _batches_in(count, feeds["epoch"])
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
  written["owner"] = put(parts["owner"], unit, tf.constant(-1, tf.int64), back)
  written["first_batch"] = put(parts["first_batch"], unit, tf.constant(0, tf.int64), back)
  written["skip"] = put(parts["skip"], unit, skip, back)
  claims = parts["claims"][worker]
  written["claims"] = put(parts["claims"], worker, FENCE_MARK - tf.maximum(claims, 0),
                           claims > FENCE_MARK)
  written["last"] = put(parts["last"], worker, tf.constant(-1, tf.int64), back)
  header, fields = layout.join(written)
  old_skip = tf.gather(parts["skip"], safe)
  none = tf.constant(-1, tf.int64), tf.constant(0, tf.int64), tf.constant(0, tf.int64)
  # The epoch is not closed here: a relaunched process may join it (its count goes on from
  # this one's) until the chief's gather arrives for the worker (`_still_lost`).
  with tf.control_dependencies([state.assign(tf.concat([tf.stack(header)] + fields, 0))]):
    return tf.stack([tf.where(back, a, b) for a, b in zip((unit, skip, old_skip), none)] +
                    [held])
