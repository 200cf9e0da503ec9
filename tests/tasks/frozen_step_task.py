"""Cluster test task: an asynchronous elastic job (examples.train's work queue and linear
model, the drop-in session) whose worker can stop inside a step, after its batch was taken and
before its gradients leave it, so that a test freezes it exactly there (SIGSTOP).

  --pause_worker=1 --pause_step=5 --pause_secs=3   worker id 1's 5th step prints
                                    `point: inside step 5` and sleeps 3 s in its forward pass
  --elastic_optimizer=false         the plain optimizer (the batch gate counts the batch as it
                                    enters the step) instead of hooks.ElasticOptimizer
"""

import faulthandler
import signal
import time

from absl import app
from absl import flags
import tensorflow as tf

from examples import train
from hooks.config import flags as epochsync_flags
from hooks.session.training_session import monitored_training_session
from hooks.sync.elastic_apply import ElasticOptimizer

_PAUSE_WORKER = flags.DEFINE_integer("pause_worker", -1, "Worker id whose step pauses.")
_PAUSE_STEP = flags.DEFINE_integer("pause_step", 5, "Its step (from 1) that pauses.")
_PAUSE_SECS = flags.DEFINE_float("pause_secs", 3.0, "How long that step pauses.")
_ELASTIC_OPTIMIZER = flags.DEFINE_bool("elastic_optimizer", True,
                                       "Wrap the optimizer in hooks.ElasticOptimizer.")
_v1 = tf.compat.v1


def _pausing(x, worker_id: int):
  """`x`, after a pause in --pause_worker's --pause_step-th step (a py_function on the worker,
  between the batch and the loss)."""
  steps = [0]

  def pause(value):
    steps[0] += 1
    if worker_id == _PAUSE_WORKER.value and steps[0] == _PAUSE_STEP.value:
      print(f"point: inside step {steps[0]}", flush=True)
      time.sleep(_PAUSE_SECS.value)
    return value

  out = tf.py_function(pause, [x], x.dtype)
  out.set_shape(x.shape)
  return out


def main(argv):
  del argv
  faulthandler.register(signal.SIGTERM, chain=True)
  _v1.disable_v2_behavior()
  config = epochsync_flags.cluster_from_flags()
  settings = epochsync_flags.settings_from_flags()
  server = config.start_server()
  if config.is_ps:
    server.join()
  with _v1.device(_v1.train.replica_device_setter(worker_device=config.job_device,
                                                  cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    epoch_input = train.unit_input("linear", config, settings,
                                   [int(n) for n in flags.FLAGS.unit_batches])
    x, y = epoch_input.get_next()
    loss = train.model_loss("linear", _pausing(x, config.worker_id), y, flags.FLAGS.features,
                            config.num_ps)
    optimizer = _v1.train.GradientDescentOptimizer(flags.FLAGS.learning_rate)
    if _ELASTIC_OPTIMIZER.value:
      optimizer = ElasticOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=global_step)
  with monitored_training_session(
      master=server.target, is_chief=config.is_chief, checkpoint_dir=flags.FLAGS.model_dir,
      epoch_input=epoch_input, settings=settings, cluster=config) as sess:
    while not sess.should_stop():
      sess.run(train_op)
  print("point: done", flush=True)


if __name__ == "__main__":
  app.run(main)
