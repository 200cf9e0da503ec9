"""The work queue's elastic runs (hooks.elastic): the gates, the reclaim and the membership.

An asynchronous step's apply is admitted first (`apply_if_member`, built by
hooks.sync.elastic_apply.ElasticOptimizer): once every gradient of the step is on its ps task,
the step counts up its worker's admission word on ps:0 (one CountUpTo: atomic, no lock) and
reads the slot's member; only a step whose word was not fenced, of the slot's member process,
applies, then counts its batch (`gated`) and marks itself done. So a batch counts exactly when
it is in the model, and a step whose worker was fenced while it computed (a frozen worker
woken) applies nothing. The chief fences a lost worker's word (`fence_admissions`), waits until
the steps admitted before are done (`in_flight`: they wait for nothing but the ps tasks), and
only then reclaims its unit, reading its count. No lock is shared by two workers' steps.

The rest runs inside the queue's lock, beside its claims (hooks.workqueue.queue_graph):
  - `gate`: each step of an elastic worker whose apply is not admitted (a plain optimizer; a
    synchronous marker passes `admit`), before its batch reaches the model: counts
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
           "membership_ops", "admission_word", "apply_if_member", "fence_admissions",
           "in_flight", "take_slot", "register_asynchronous", "registered_asynchronous",
           "applies_if_admitted", "AsynchronousWorker", "ADMISSION_FENCE"]

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
  lost worker's batches of it in the model, with the worker's admissions fenced and done first:
  `fence_admissions`, `in_flight`)]."""
  epoch: tf.Tensor
  worker: tf.Tensor
  result: tf.Tensor


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
# (hooks.sync.elastic_apply), the graphs whose step applies only if admitted, and each graph's
# admission words by worker id.
_ASYNC_QUEUES: "weakref.WeakKeyDictionary[tf.Graph, object]" = weakref.WeakKeyDictionary()
_APPLIES: "weakref.WeakKeyDictionary[tf.Graph, int]" = weakref.WeakKeyDictionary()
_WORDS: "weakref.WeakKeyDictionary[tf.Graph, dict]" = weakref.WeakKeyDictionary()
ADMISSION_FENCE = 2**40  # added to a fenced worker's admission word
_NO_LIMIT = 2**62  # CountUpTo's limit: never reached (a fenced word stays far below it)


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


def applies_if_admitted(graph: tf.Graph) -> int:
  """How many applies of `graph`'s step are admitted by `apply_if_member` (0: the batch's gate
  counts the batch)."""
  return _APPLIES.get(graph, 0)


def admission_word(ops, worker_id: int) -> tf.Variable:
  """Worker `worker_id`'s admission word on ps:0: a scalar its steps count up (CountUpTo, which
  returns the count before: one atomic op) and the chief's fence raises by ADMISSION_FENCE. In
  no collection (never saved): each run's start resets it (graph_keys.RESET_OPS)."""
  graph = _v1.get_default_graph()
  while getattr(graph, "outer_graph", None) is not None:  # a cond branch's (control flow v2)
    graph = graph.outer_graph
  words = _WORDS.setdefault(graph, {})
  if worker_id not in words:
    with graph.as_default(), _v1.device(ops.gated.device), _v1.name_scope("epochsync/workqueue/"):
      words[worker_id] = _v1.Variable(tf.constant(0, tf.int64), trainable=False, collections=[],
                                      use_resource=True, name=f"admitted_{worker_id}")
    graph.add_to_collection(graph_keys.RESET_OPS, words[worker_id].initializer)
  return words[worker_id]


def _admission(ops, worker_id: int, identity: tf.Tensor, inputs) -> tf.Tensor:
  """(On ps:0, once every tensor of `inputs` exists) Counts up worker `worker_id`'s admission
  word and answers whether the step is admitted: the word was not fenced and this process
  (`identity`: 0 for the run's own process, its token once it joined) is the slot's member,
  read after the count (see take_slot). A refused step is done at once; an admitted one's
  caller counts its batch (`_count`)."""
  word = admission_word(ops, worker_id)
  identity = tf.identity(identity)  # read here, on the ps
  with tf.control_dependencies(list(inputs) + [identity]):
    before = tf.raw_ops.ResourceCountUpTo(resource=word.handle, limit=_NO_LIMIT, T=tf.int64)
  with tf.control_dependencies([before]):
    member = tf.gather(ops.joined_by, worker_id)
  passed = tf.logical_and(before < ADMISSION_FENCE, tf.equal(member, identity))
  refused = tf.reshape(tf.cast(tf.logical_not(passed), tf.int64), [1])
  with tf.control_dependencies([ops.done.scatter_nd_add([[worker_id]], refused)]):
    return tf.identity(passed)


def _count(ops, worker_id: int) -> tf.Operation:
  """An admitted step's batch counted as the worker's (`gated`), then the step done: the
  chief, which waits for the admitted steps to be done, then reads every count."""
  one = tf.ones([1], tf.int64)
  with tf.control_dependencies([ops.gated.scatter_nd_add([[worker_id]], one)]):
    return ops.done.scatter_nd_add([[worker_id]], one)


def apply_if_member(ops, worker_id: int, identity: tf.Tensor, inputs, apply_fn
                    ) -> tf.Operation:
  """The step's apply of worker `worker_id`, once every tensor of `inputs` (the step's
  gradients, each already on its variable's ps task) exists and the step was admitted
  (`_admission`): `apply_fn()` (returning an op), then its batch counted; a refused step fails
  before applying, with InvalidArgumentError carrying `errors.FENCED_MARK`
  (WorkerFencedError). O(1) words on ps:0, no lock: a frozen worker holds nothing."""
  graph = _v1.get_default_graph()
  _APPLIES[graph] = _APPLIES.get(graph, 0) + 1
  device = ops.gated.device
  with _v1.device(device), tf.name_scope("epochsync_elastic_apply"):
    check = refuse_fenced(_admission(ops, worker_id, identity, inputs), worker_id)
  with tf.control_dependencies([check]), _v1.device(device):  # its own tensors on the ps too
    update = apply_fn()
  with _v1.device(device), tf.control_dependencies([update]):
    return _count(ops, worker_id)


def fence_admissions(ops, worker_id: int) -> tf.Tensor:
  """(The chief) Fences worker `worker_id`'s steps: its word rises by ADMISSION_FENCE (a step
  counting up after this is refused; run again, the word stays fenced). Returns the steps
  admitted and not yet done (poll it with `in_flight` until 0)."""
  word = admission_word(ops, worker_id)
  fenced = word.assign_add(ADMISSION_FENCE, read_value=False)
  with tf.control_dependencies([fenced]):
    return in_flight(ops, worker_id)


def in_flight(ops, worker_id: int) -> tf.Tensor:
  """(The chief) The fenced worker's steps admitted and not done yet: 0 once every apply that
  was admitted before the fence counted its batch (it waits only for the ps tasks)."""
  word = admission_word(ops, worker_id)
  return tf.math.floormod(word.read_value(), ADMISSION_FENCE) - tf.gather(ops.done, worker_id)


def take_slot(ops, worker_id: int) -> tf.Operation:
  """(A process that joined in place of fenced worker `worker_id`) lifts its admission fence:
  the word goes back to the steps done. The queue's join set the slot's member (joined_by)
  first, so a step of an earlier process admitted from now on reads another member."""
  word = admission_word(ops, worker_id)
  return word.assign(tf.gather(ops.done, worker_id), read_value=False)


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


def gate(ops, worker_id: int, after: tf.Operation, identity: tf.Tensor,
         enabled: "tf.Tensor | None" = None) -> tf.Operation:
  """The op a step of worker `worker_id` runs before its batch reaches the model, after
  `after` (the step's take of the batch), while `enabled` (a bool on the worker, None: always;
  off where the step's apply is admitted instead: `apply_if_member`): the step's admission on
  ps:0 (`_admission`, no lock), and its batch counted as the worker's; a refused step fails
  with InvalidArgumentError carrying `errors.FENCED_MARK` (hooks.faults.step_retry turns it
  into WorkerFencedError). `ops`: the queue's QueueOps, built with elastic=True."""
  admission_word(ops, worker_id)  # built here, outside the cond below
  with _v1.device(ops.gated.device), tf.name_scope("epochsync_workqueue_gate"):

    def admit_and_count():
      passed = _admission(ops, worker_id, identity, [after])
      counted = tf.cond(passed, lambda: _after(_count(ops, worker_id), tf.constant(True)),
                        lambda: tf.constant(False))
      return counted

    passed = (admit_and_count() if enabled is None else
              tf.cond(enabled, admit_and_count, lambda: tf.constant(True)))
    return refuse_fenced(passed, worker_id)


def _after(first, value: tf.Tensor) -> tf.Tensor:
  with tf.control_dependencies([first]):
    return tf.identity(value)


def refuse_fenced(passed: tf.Tensor, worker_id: int) -> tf.Operation:
  """Fails the run unless `passed` (admit's answer): InvalidArgumentError carrying
  `errors.FENCED_MARK`, which hooks.faults.step_retry turns into WorkerFencedError."""
  return tf.debugging.Assert(passed, [tf.constant(
      f"{FENCED_MARK}: worker id {worker_id}, found lost by the chief")], name="fence")


def reclaim_ops(lock: tf.CriticalSection, state, gated, layout: Layout) -> ReclaimOps:
  feeds = {name: _v1.placeholder(tf.int64, [], "reclaim_" + name) for name in ("epoch", "worker")}
  result = execute_unrecorded(lock, functools.partial(_reclaim, state, gated, feeds, layout))
  return ReclaimOps(result=result, **feeds)


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
