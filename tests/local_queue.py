"""A work queue's graph (hooks.workqueue.queue_graph) on a local session, for in-process tests.

  queue = LocalQueue(units=5, workers=2)
  unit = queue.claim(0, worker=1, seq=0)                       # the unit handed out
  unit, skip = queue.claim_and_skip(0, 1, 1, at=3, finished=(unit, 3, 24))
  state = queue.state()                                        # the fields, by name
  queue.pass_gate(worker=1, times=3)     # (elastic) three of its steps' batches pass the gate
  queue.reclaim(0, worker=1)             # (elastic) the chief's fence and reclaim of worker 1
"""

import tensorflow as tf

from hooks import graph_keys
from hooks.workqueue import elastic_graph, queue_graph

_v1 = tf.compat.v1


class LocalQueue:
  """A queue of `units` units; each claim is one run, as UnitClaims makes it."""

  def __init__(self, units=5, workers=2, seed=7, shuffle=True, fingerprint="0", elastic=False):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.ops = queue_graph.build(units, workers, seed, shuffle, "/cpu:0", fingerprint, elastic)
      init = _v1.global_variables_initializer()
      self._identity = _v1.placeholder_with_default(tf.constant(0, tf.int64), [])
      if elastic:  # the chief's admission fences and a joined process's take of its slot
        self._fences = [elastic_graph.fence_admissions(self.ops, w) for w in range(workers)]
        self._take = [elastic_graph.take_slot(self.ops, w) for w in range(workers)]
      reset = self.graph.get_collection(graph_keys.RESET_OPS)
    self.session = _v1.Session(graph=self.graph)
    self.session.run(init)
    self.session.run(reset)  # the run's start (RunStartHook)
    self._gates = {}
    self._identities = {}  # worker -> the token of the process that joined its slot

  def claim(self, epoch, worker, seq, at=0, finished=(-1, 0, 0), wanted=queue_graph.ANY):
    return self.claim_and_skip(epoch, worker, seq, at, finished, wanted)[0]

  def claim_and_skip(self, epoch, worker, seq, at=0, finished=(-1, 0, 0),
                     wanted=queue_graph.ANY):
    ops = self.ops
    unit, skip = self.session.run(ops.claim, {
        ops.epoch: epoch, ops.worker: worker, ops.seq: seq, ops.at_batch: at,
        ops.finished: finished[0], ops.finished_batches: finished[1],
        ops.finished_examples: finished[2], ops.wanted: wanted})
    return int(unit), int(skip)

  def state(self):
    return self.session.run(self.ops.state)

  def vector(self):
    return self.session.run(self.ops.vector)

  def write(self, vector):
    self.session.run(self.ops.assign, {self.ops.new_vector: vector})

  def reclaim(self, epoch, worker):
    """The chief's reclaim of lost `worker`'s unit in flight (elastic): (unit, its skip)."""
    return self.reclaim_result(epoch, worker)[:2]

  def reclaim_result(self, epoch, worker):
    """(unit, its new skip, its old skip, the worker's epoch batches in the model), after the
    chief's fence of the worker's steps (hooks.elastic.lost_workers)."""
    assert int(self.session.run(self._fences[worker])) == 0  # no admitted step in flight
    ops = self.ops.reclaim
    return tuple(int(x) for x in self.session.run(ops.result, {ops.epoch: epoch,
                                                               ops.worker: worker}))

  def join(self, epoch, worker, token=7, spares=0):
    """A relaunched `worker`'s (or a spare's) join at `epoch` (elastic), in a job of `spares`
    spares: JOINED, NOT_FENCED, CLOSED or FULL."""
    return self.join_and_held(epoch, worker, token, spares)[0]

  def join_and_held(self, epoch, worker, token=7, spares=0):
    """(the join's answer, its earlier process's batches of `epoch` in the model)."""
    ops = self.ops.membership
    answer, held = self.session.run(ops.join, {ops.epoch: epoch, ops.worker: worker,
                                               ops.token: token, ops.spares: spares})
    if int(answer) == elastic_graph.JOINED:  # as UnitClaims.join: the process takes the slot
      self.session.run(self._take[worker])
      self._identities[worker] = token
    return int(answer), int(held)

  def still_lost(self, epoch, worker):
    """The chief's check at `epoch`'s barrier: whether it arrives for `worker`."""
    return self.still_lost_and_held(epoch, worker)[0]

  def still_lost_and_held(self, epoch, worker):
    """(whether the chief arrives for `worker` at `epoch`'s barrier, its batches of `epoch`)."""
    ops = self.ops.membership
    lost, held = self.session.run(ops.still_lost, {ops.epoch: epoch, ops.worker: worker})
    return bool(lost), int(held)

  def pass_gate(self, worker, times=1):
    """`times` steps of `worker` pass the gate (elastic; a fenced one: InvalidArgumentError)."""
    if worker not in self._gates:
      with self.graph.as_default():
        self._gates[worker] = elastic_graph.gate(self.ops, worker, tf.no_op(), self._identity)
    for _ in range(times):
      self.session.run(self._gates[worker], {self._identity: self._identities.get(worker, 0)})
