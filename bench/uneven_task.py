"""One task of the uneven-shard benchmark: epochs of synchronous SGD on shards of unequal size.

--variant=ours:  EpochInput + epoch_sync_hooks + WorkerDoneSyncReplicasOptimizer, one pass over
                 the shard per epoch (no save: the epoch is the steps, the done signal and the
                 barrier). Epoch e uses the skew --skews[e % len(skews)] (same total), so one
                 cluster measures every skew, alternately. Records each step and when each
                 epoch's barrier released this task.
--variant=stock: the usual workaround: every shard repeated forever, stock
                 SyncReplicasOptimizer(N, N), StopAtStepHook at a precomputed max_steps =
                 epochs * (total batches / N). When the chief stops it hands out one token per
                 worker, so a worker blocked on its next token finishes its step and stops
                 too (without that, stock waits forever). Records how many batches it trained.

Typical usage (what bench.uneven starts on every task of a LocalCluster):
  python -m bench.uneven_task --variant=ours --skews=0,0.3,0.6 --epochs=6 --output_dir=/tmp/o
  python -m bench.uneven_task --variant=stock --skews=0.6 --epochs=1 --output_dir=/tmp/o
"""

import json
import os
import time

from absl import app
from absl import flags
import tensorflow as tf

from bench import task_common
from bench.common import MLP_SIZES, generated_batches, shard_batches
from hooks.session import creators as session_lib
from hooks.data.epoch_input import EpochInput, EpochListener
from hooks.session.wiring import epoch_sync_hooks
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer

__all__ = []

_VARIANT = flags.DEFINE_enum("variant", "ours", ["ours", "stock"], "See the module doc.")
_SKEWS = flags.DEFINE_list("skews", ["0", "0.3", "0.6"], "Skews, epoch by epoch (stock: the "
                           "first).")
_MEAN = flags.DEFINE_integer("mean_batches", 40, "Batches of the mean shard.")
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs (stock: max_steps = epochs * mean shard).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Examples per batch.")
_SIZE = flags.DEFINE_enum("size", "1M", list(MLP_SIZES), "MLP size preset.")
_AUTOTUNE = flags.DEFINE_bool("dataset_autotune", True, "tf.data autotune in the input "
                              "pipeline (its default; off makes re-initialising it cheaper).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where each task writes its record.")

_v1 = tf.compat.v1


class _SetShard(EpochListener):
  """Sets how many batches the next epoch's dataset takes, before its iterator starts."""
  order = 40

  def __init__(self, sizes, count_var):
    self._sizes, self._var = sizes, count_var
    self._value = _v1.placeholder(tf.int64, [])
    self._assign = count_var.assign(self._value)

  def _set(self, session, epoch):
    session.run(self._assign, {self._value: self._sizes[epoch % len(self._sizes)]})

  def session_created(self, session, start_epoch):
    self._set(session, start_epoch)

  def epoch_ended(self, session, stats):
    self._set(session, stats.epoch + 1)


class _Releases(EpochListener):
  """After the barrier (order 20): when this task left each epoch's end barrier."""
  order = 30

  def __init__(self):
    self.started, self.released = [], []

  def session_created(self, session, start_epoch):
    self.started.append(time.time())  # after the start barrier (order 20)

  def epoch_ended(self, session, stats):
    self.released.append(time.time())



def main(argv):
  del argv
  config, settings, server = task_common.start_task()
  n, me, stock = config.num_workers, config.worker_id, _VARIANT.value == "stock"
  skews = [float(s) for s in _SKEWS.value]
  sizes = [shard_batches(s, n, _MEAN.value)[me] for s in skews]  # This worker's, by skew.
  width, hidden = MLP_SIZES[_SIZE.value]
  max_steps = _EPOCHS.value * sum(shard_batches(skews[0], n, _MEAN.value)) // n
  sgd = _v1.train.GradientDescentOptimizer(0.01)
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    if stock:
      dataset = generated_batches(sizes[0], _BATCH.value, width, me, _AUTOTUNE.value).repeat()
      inputs = _v1.data.make_one_shot_iterator(dataset).get_next()
    else:
      with _v1.device(config.job_device):
        count = _v1.Variable(0, dtype=tf.int64, trainable=False, name="bench_shard_batches",
                             collections=[_v1.GraphKeys.LOCAL_VARIABLES])
      dataset = generated_batches(count, _BATCH.value, width, me, _AUTOTUNE.value)
      epoch_input = EpochInput(dataset, _EPOCHS.value, config.task_name)
      inputs = epoch_input.get_next()
    h = _v1.layers.dense(inputs[0], hidden, activation=tf.nn.relu, name="hidden")
    loss = tf.reduce_mean(tf.square(_v1.layers.dense(h, width, name="out") - inputs[1]))
    if stock:
      opt = _v1.train.SyncReplicasOptimizer(sgd, replicas_to_aggregate=n, total_num_replicas=n)
    else:
      opt = WorkerDoneSyncReplicasOptimizer(sgd, n, me, worker_names=config.worker_names)
    train_op = opt.minimize(loss, global_step=global_step)
    if stock:
      with _v1.device(global_step.device):
        started = _v1.get_variable("bench_started", [], tf.int64, _v1.zeros_initializer(),
                                   trainable=False)
        count_in, read_started = started.assign_add(1), started.read_value()
        # Stock's own token queue (a private attribute): one token per worker at the end.
        release = opt._sync_token_queue.enqueue_many(  # pylint: disable=protected-access
            [tf.fill([n], global_step)])
  steps = task_common.StepTimes()
  sync_hook = opt.make_session_run_hook(config.is_chief, num_tokens=0)
  if stock:
    hooks = [steps, sync_hook, _v1.train.StopAtStepHook(last_step=max_steps)]
  else:
    releases = _Releases()
    epoch_input.add_listener(releases)
    epoch_input.add_listener(_SetShard(sizes, count))
    hooks = [steps] + epoch_sync_hooks(config, epoch_input, settings, sync_hook=sync_hook)
  creator = session_lib.session_creator(config, master=server.target)
  record = {"task": config.task_name, "variant": _VARIANT.value, "worker_id": me,
            "skews": skews, "shard_batches": sizes, "batch_size": _BATCH.value,
            "max_steps": max_steps}
  sess = _v1.train.MonitoredSession(session_creator=creator, hooks=hooks)
  if stock:
    sess.run(count_in)  # Start together, as the epoch barrier makes ours do.
    deadline = time.monotonic() + 120
    while sess.run(read_started) < n and time.monotonic() < deadline:
      time.sleep(0.01)
    record["started"] = time.time()
  while not sess.should_stop():
    sess.run(train_op)
  record["ended"] = time.time()
  record["steps"] = steps.steps
  if stock:
    record["batches_trained"] = len(steps.steps)  # Each one from the repeated shard, in order.
    if config.is_chief:  # The stopped MonitoredSession refuses runs: its raw session does not.
      raw = sess._tf_sess()  # pylint: disable=protected-access
      record["global_step"] = int(raw.run(global_step))
      raw.run(release)
  else:
    record.update(started=releases.started[0], released=releases.released,
                  history=[[s.epoch, s.batches, s.examples] for s in epoch_input.hook.history])
  with open(os.path.join(_OUTPUT_DIR.value, config.task_name.replace(":", "-") + ".json"),
            "w") as f:
    json.dump(record, f)
  os._exit(0)  # Stock's chief queue runner stays blocked in take_grad (as in bench.sync_task).


if __name__ == "__main__":
  app.run(main)
