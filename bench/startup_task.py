"""bench/startup.py's task: examples.train, with the chief optionally initialising late.

  --chief_init_delay_secs=3   the chief creates its session 3 s late (its server and graph are
                              up, a hook's begin() sleeps), so every worker asks for the model
                              before the chief initialised it: the case the readiness poll
                              interval matters
"""

import time

from absl import app
from absl import flags
import tensorflow as tf

from examples import train

_CHIEF_DELAY = flags.DEFINE_float("chief_init_delay_secs", 0.0,
                                  "The chief initialises the model this late.")


class _DelayBegin(tf.compat.v1.train.SessionRunHook):

  def begin(self):
    time.sleep(_CHIEF_DELAY.value)


def main(argv):
  del argv
  train.train(lambda config, epoch_input: [_DelayBegin()] if (
      config.is_chief and _CHIEF_DELAY.value > 0) else [])


if __name__ == "__main__":
  app.run(main)
