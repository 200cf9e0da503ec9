"""bench.work_queue's task: examples.train with a pause after every step (the worker's speed).

  python bench/work_queue_task.py --step_sleep_secs=0.05 --slowdown=2 [examples.train's flags]

SIGUSR1 prints every thread's Python stack to the log (a task that lingers: where it waits).
"""

import faulthandler
import signal
import time

from absl import app
from absl import flags
import tensorflow as tf

from examples import train

_SLEEP = flags.DEFINE_float("step_sleep_secs", 0.05, "Pause after every step.", lower_bound=0.0)
_SLOWDOWN = flags.DEFINE_float("slowdown", 1.0, "This task pauses this many times as long.",
                               lower_bound=0.0)


class _Pause(tf.compat.v1.train.SessionRunHook):

  def after_run(self, run_context, run_values):
    time.sleep(_SLEEP.value * _SLOWDOWN.value)


def main(argv):
  del argv
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  train.train(lambda config, epoch_input: [_Pause()])


if __name__ == "__main__":
  app.run(main)
