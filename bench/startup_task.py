"""bench/startup.py's task: examples.train, with the chief optionally starting late.

  --chief_start_delay_secs=3   the chief builds its graph 3 s late, so every worker asks
                               for the model before the chief initialised it (the worst case
                               for a worker's readiness poll)
"""

import time

from absl import app
from absl import flags

from examples import train
from hooks import flags as epochsync_flags

_CHIEF_DELAY = flags.DEFINE_float("chief_start_delay_secs", 0.0, "The chief starts this late.")


def main(argv):
  del argv
  if _CHIEF_DELAY.value > 0 and epochsync_flags.cluster_from_flags().is_chief:
    time.sleep(_CHIEF_DELAY.value)
  train.train()


if __name__ == "__main__":
  app.run(main)
