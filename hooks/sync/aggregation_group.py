"""Several sync optimizers' aggregation threads, in lockstep, seen as one by a mid-epoch saver.

A canned wide & deep model trains with two WorkerDoneSyncReplicasOptimizers (linear and DNN
parts), and the chief runs one aggregation thread per optimizer. A mid-epoch checkpoint must
hold every optimizer's variables after the same step s. Alone, a thread that finished step s
would issue its next aggregation at once and, as soon as the other optimizer released its
tokens, apply step s+1 while the checkpoint is written. So each thread, after aggregating a
step, waits here until every thread aggregated it; the last one to arrive runs the callbacks
(e.g. the save) while the others wait, then releases them. This costs no throughput: a
thread's next aggregation needs the workers' next gradients, and those need every optimizer's
token of step s.

Typical usage:
  group = AggregationGroup([linear_opt_hook, dnn_opt_hook])
  hooks = epoch_sync_hooks(config, epoch_input, settings, model_dir=d, sync_hook=group)
"""

import threading
import time
from typing import Any, Callable, List, Sequence

from hooks import log as logging

__all__ = ["AggregationGroup"]

_POLL_SECS = 0.2  # How often a waiting thread checks that its peers still aggregate.


class AggregationGroup:
  """The chief's SafeSyncTokensHooks; `on_aggregated` callbacks run once per step, all paused.

    group = AggregationGroup([hook_a, hook_b])
    group.on_aggregated(lambda session, grads: ...)   # once per step, every thread paused

  Args:
    hooks: the `SafeSyncTokensHook`s of every sync optimizer of the model (one is allowed).
    max_wait_secs: `float`, the longest a thread waits for its peers at one step (a peer's
      aggregation needs the same gradients as its own, so it normally comes within
      milliseconds); past it the group gives up its callbacks for good (WARNING).

  A thread whose peers stop aggregating (an error, the end of training) stops waiting within
  0.2 s and skips the callbacks of that step: no wait here outlives the session.
  """

  def __init__(self, hooks: Sequence[Any], max_wait_secs: float = 600.0):
    if not hooks:
      raise ValueError("AggregationGroup needs at least one SafeSyncTokensHook")
    self.hooks: List[Any] = list(hooks)
    self._max_wait = float(max_wait_secs)
    self._callbacks: List[Callable[[Any, int], None]] = []
    self._cond = threading.Condition()
    self._rounds = [0] * len(self.hooks)  # Steps each thread aggregated in this group.
    self._arrived = 0  # Threads that aggregated the current round.
    self._done_round = -1  # The last round whose callbacks ran.
    self._broken = False  # A peer stopped aggregating: the session ends, no more rounds.
    for index, hook in enumerate(self.hooks):
      hook.on_aggregated(lambda session, grads, index=index: self._arrive(index, session, grads))

  def use_liveness(self, monitor: Any, epoch_fn: Callable[[], Any] = lambda: None) -> None:
    for hook in self.hooks:
      hook.use_liveness(monitor, epoch_fn)

  def on_aggregated(self, fn: Callable[[Any, int], None]) -> None:
    """`fn(session, g)` once per step, after every thread aggregated it, before any goes on."""
    self._callbacks.append(fn)

  def _arrive(self, index: int, session: Any, grads: int) -> None:
    with self._cond:
      this_round = self._rounds[index]
      self._rounds[index] += 1
      self._arrived += 1
      if self._arrived < len(self.hooks):
        deadline = time.monotonic() + self._max_wait
        while self._done_round < this_round and not self._broken:
          if not all(h.aggregating for h in self.hooks):
            self._broken = True  # A peer stopped: this step will never complete here.
          elif time.monotonic() > deadline:
            self._broken = True
            logging.warning("the sync optimizers' aggregation threads did not all finish step "
                            "%d within %.0f s of each other: no more mid-epoch checkpoints in "
                            "this session", this_round, self._max_wait)
          else:
            self._cond.wait(_POLL_SECS)
        return
      if self._broken:
        return
      self._arrived = 0
      try:
        for fn in self._callbacks:
          fn(session, grads)
      finally:
        self._done_round = this_round
        self._cond.notify_all()
