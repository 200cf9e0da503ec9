"""bench/startup.py's task: examples.train, with the chief optionally initialising late.

  --chief_init_delay_secs=3   the chief creates its session 3 s late (its server and graph are
                              up, a hook's begin() sleeps), so every worker asks for the model
                              before the chief initialised it: the case the readiness poll
                              interval matters
  --stages                    writes <model_dir>/stages-<task>.json: when each start-up stage
                              began and ended (every hook's begin() and after_create_session(),
                              the session's creation) and when the task arrived at the start
                              barrier; the hooks are timed in place (their types unchanged)
"""

import functools
import json
import os
import time

from absl import app
from absl import flags
import tensorflow as tf

from examples import train
from hooks.epoch.barrier import EpochBarrierHook

_CHIEF_DELAY = flags.DEFINE_float("chief_init_delay_secs", 0.0,
                                  "The chief initialises the model this late.")
_STAGES = flags.DEFINE_bool("stages", False, "Record the start-up stages (see the module doc).")

_v1 = tf.compat.v1


class _DelayBegin(_v1.train.SessionRunHook):

  def begin(self):
    time.sleep(_CHIEF_DELAY.value)


def _timed(stages, name, method):
  @functools.wraps(method)
  def call(*args, **kwargs):
    start = time.time()
    try:
      return method(*args, **kwargs)
    finally:
      stages.append((name, start, time.time()))
  return call


def _record_stages(stages) -> None:
  """Times every hook's begin()/after_create_session() and the session's creation, in place."""
  init = _v1.train.MonitoredSession.__init__

  def timed_init(self, session_creator=None, hooks=None, **kwargs):
    for hook in hooks or []:
      for method in ("begin", "after_create_session"):
        setattr(hook, method, _timed(stages, f"{type(hook).__name__}.{method}",
                                     getattr(hook, method)))
    session_creator.create_session = _timed(stages, "create_session",
                                            session_creator.create_session)
    init(self, session_creator=session_creator, hooks=hooks, **kwargs)

  _v1.train.MonitoredSession.__init__ = timed_init
  created = EpochBarrierHook.session_created

  def arrive(self, session, start_epoch):
    stages.append(("start barrier arrival", time.time(), time.time()))
    return created(self, session, start_epoch)

  EpochBarrierHook.session_created = arrive


def main(argv):
  del argv
  stages = []
  if _STAGES.value:
    _record_stages(stages)
  summary = train.train(lambda config, epoch_input: [_DelayBegin()] if (
      config.is_chief and _CHIEF_DELAY.value > 0) else [])
  if _STAGES.value and summary:
    path = os.path.join(flags.FLAGS.model_dir,
                        "stages-" + summary["task"].replace(":", "-") + ".json")
    with open(path, "w") as f:
      json.dump({"task": summary["task"], "stages": stages}, f)


if __name__ == "__main__":
  app.run(main)
