"""What an elastic job's hooks refuse before the first step (hooks.session.wiring), and what a
synchronous one wires (hooks.session.elastic_sync): docs/elastic.md, "Turning it on"."""

import time

import pytest
import tensorflow as tf

from hooks.config.cluster import ClusterConfig
from hooks.config.settings import EpochSyncSettings
from hooks.data.epoch_input import EpochInput
from hooks.elastic import LostWorkerWatch
from hooks.elastic.lost_workers import probe_period_secs
from hooks.errors import FENCED_MARK, ConfigError
from hooks.epoch.run_start import RunStartHook
from hooks.session.wiring import epoch_sync_hooks
from hooks.sync.aggregation_group import AggregationGroup
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
from hooks.workqueue import work_queue_input
from hooks.workqueue.units import WorkUnit
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)

CHIEF = ClusterConfig({"chief": ["localhost:1"], "worker": ["localhost:2"],
                       "ps": ["localhost:3"]}, "chief", 0)


def _settings(sync):
  return EpochSyncSettings(num_epochs=1, sync=sync, elastic=True, save_checkpoint_secs=0)


def _queue_input(settings):
  units = [WorkUnit("", 0, 4), WorkUnit("", 4, 8)]
  return work_queue_input(units, lambda u: tf.data.Dataset.range(4).batch(2), num_epochs=1,
                          num_workers=2, worker_id=0, task_name="chief:0", ps_device="",
                          settings=settings)


def _sync_hook(epoch_input, name="worker_done_sync_replicas"):
  batch = tf.cast(epoch_input.get_next(), tf.float32)
  weight = v1.Variable(1.0)
  opt = WorkerDoneSyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1), num_workers=2,
                                        worker_id=0, worker_names=["chief:0", "worker:0"],
                                        name=name)
  opt.minimize(tf.reduce_sum(batch * weight), global_step=v1.train.get_or_create_global_step())
  return opt.make_session_run_hook(is_chief=True)


def test_elastic_without_a_work_queue_is_refused(graph):
  shard = EpochInput(tf.data.Dataset.range(6).batch(2), num_epochs=1, task_name="chief:0")
  with pytest.raises(ConfigError, match="needs a work queue"):
    epoch_sync_hooks(CHIEF, shard, _settings(sync=False))


def test_a_sync_optimizer_in_a_job_set_asynchronous_is_refused(graph):
  epoch_input = _queue_input(_settings(sync=False))
  with pytest.raises(ConfigError, match="--epochsync_sync=false but a sync optimizer"):
    epoch_sync_hooks(CHIEF, epoch_input, _settings(sync=False),
                     sync_hook=_sync_hook(epoch_input))


def test_a_synchronous_job_without_its_sync_optimizer_is_refused(graph):
  with pytest.raises(ConfigError, match="--epochsync_sync=true but no sync optimizer"):
    epoch_sync_hooks(CHIEF, _queue_input(_settings(sync=True)), _settings(sync=True))


def _queue_built_with(elastic, sync=False, num_workers=2):
  units = [WorkUnit("", 0, 4), WorkUnit("", 4, 8)]
  return work_queue_input(units, lambda u: tf.data.Dataset.range(4).batch(2), num_epochs=1,
                          num_workers=num_workers, worker_id=0, task_name="chief:0",
                          ps_device="", settings=EpochSyncSettings(
                              num_epochs=1, sync=sync, elastic=elastic, save_checkpoint_secs=0))


@pytest.mark.parametrize("queue_elastic", [False, True])
def test_a_queue_built_without_the_hooks_elastic_setting_is_refused(graph, queue_elastic):
  """A queue built without settings= (the flags' default: not elastic) beside elastic hooks
  has no reclaim: the chief's first loss would fail every task. Refused before any session."""
  hooks_settings = EpochSyncSettings(num_epochs=1, sync=False, elastic=not queue_elastic,
                                     save_checkpoint_secs=0)
  with pytest.raises(ConfigError, match=(
      rf"built with elastic={queue_elastic}, the hooks have --epochsync_elastic="
      rf"{str(not queue_elastic).lower()}: pass the same settings to work_queue_input")):
    epoch_sync_hooks(CHIEF, _queue_built_with(elastic=queue_elastic), hooks_settings)


def test_an_elastic_queue_built_for_the_other_kind_of_training_is_refused(graph):
  epoch_input = _queue_built_with(elastic=True, sync=False)
  with pytest.raises(ConfigError, match=r"elastic work queue was built with sync=False, the "
                                        r"hooks have --epochsync_sync=true"):
    epoch_sync_hooks(CHIEF, epoch_input, _settings(sync=True), sync_hook=_sync_hook(epoch_input))


def test_a_queue_built_for_another_worker_count_is_refused(graph):
  with pytest.raises(ConfigError, match=r"built for num_workers=3, the hooks' cluster has 2 "
                                        r"\(give work_queue_input num_workers=config.num_workers"):
    epoch_sync_hooks(CHIEF, _queue_built_with(elastic=False, num_workers=3),
                     EpochSyncSettings(num_epochs=1, save_checkpoint_secs=0))


def test_a_synchronous_elastic_job_wires_idle_steps_and_the_lost_marker(graph):
  settings = _settings(sync=True)
  epoch_input = _queue_input(settings)
  hook = _sync_hook(epoch_input)
  assert hook.optimizer.sync_ops.idle_op is not None  # built over the registered queue
  hooks = epoch_sync_hooks(CHIEF, epoch_input, settings, sync_hook=hook)
  watch = next(h for h in hooks if isinstance(h, LostWorkerWatch))
  assert watch._on_lost is not None and watch._stalled_after == settings.step_timeout_secs / 2
  assert watch._period == 0.1  # a small job's lost worker is found within 0.1 s
  assert epoch_input.passes.claims.while_waiting is not None


class _FailingSession:
  """A session whose every run fails with `error`."""

  def __init__(self, error):
    self.error = error

  def run(self, *args, **kwargs):
    raise self.error


@pytest.mark.parametrize("error,fenced,raised", [
    (tf.errors.DeadlineExceededError(None, None, "Operation timed out."), True,
     "WorkerFencedError"),
    (tf.errors.DeadlineExceededError(None, None, "Operation timed out."), False,
     "StepTimeoutError"),
    (tf.errors.InvalidArgumentError(None, None, f"assertion failed: [{FENCED_MARK}: worker id "
                                    "0, found lost by the chief]"), False, "WorkerFencedError"),
    (tf.errors.InvalidArgumentError(None, None, "another assertion"), False,
     "InvalidArgumentError")])
def test_a_step_without_a_batch_that_fails_after_the_chief_fenced_the_worker_says_so(
    graph, error, fenced, raised):
  """A worker frozen in such a step wakes past its deadline (or its marker is refused): it is
  told it was found lost, not that the chief's aggregation is stuck."""
  settings = _settings(sync=True)
  epoch_input = _queue_input(settings)
  epoch_sync_hooks(CHIEF, epoch_input, settings, sync_hook=_sync_hook(epoch_input))
  claims = epoch_input.passes.claims
  claims.fenced = lambda session: fenced
  with pytest.raises(Exception) as raised_error:
    claims.while_waiting(_FailingSession(error))
  assert type(raised_error.value).__name__ == raised, raised_error.value
  if raised == "WorkerFencedError":
    assert "was found lost by the chief" in str(raised_error.value)


@pytest.mark.parametrize("num_workers,period", [(2, 0.1), (25, 0.1), (100, 0.4), (250, 1.0),
                                                (2000, 1.0)])
def test_the_chief_probes_a_small_job_every_0_1_s_and_spends_at_most_5_percent_on_probes(
    num_workers, period):
  assert probe_period_secs(num_workers) == pytest.approx(period)


def test_the_watch_waits_long_enough_to_keep_its_cpu_under_5_percent():
  """A round of probes that costs 20 ms of CPU (a large job, a slow machine) is followed by a
  wait of at least 0.4 s; a cheap round by the period."""
  watch = LostWorkerWatch.__new__(LostWorkerWatch)  # only the loop: no graph, no monitor
  watch._period, watch._names = 0.1, ["chief:0"]  # pylint: disable=protected-access
  waits, costs = [], iter([0.02, 0.0, 0.0])

  class _Stop:
    def wait(self, secs):
      waits.append(secs)
      return len(waits) > 3

  def burn(session):
    del session
    end = time.thread_time() + next(costs)
    while time.thread_time() < end:
      pass

  watch._stop, watch._watch_once = _Stop(), burn  # pylint: disable=protected-access
  watch._watch(None, None)  # pylint: disable=protected-access
  assert waits[0] == 0.1 and waits[1] >= 0.4 and waits[2] == 0.1, waits


def test_two_sync_optimizers_are_refused(graph):
  settings = _settings(sync=True)
  epoch_input = _queue_input(settings)
  group = AggregationGroup([_sync_hook(epoch_input), _sync_hook(epoch_input, "second")])
  with pytest.raises(ConfigError, match="takes one sync optimizer, not 2"):
    epoch_sync_hooks(CHIEF, epoch_input, settings, sync_hook=group)


def test_spare_workers_are_the_last_worker_ids_and_the_chief_is_never_one(graph):
  settings = EpochSyncSettings(num_epochs=1, sync=False, elastic=True, save_checkpoint_secs=0,
                               spare_workers=1)
  hooks = epoch_sync_hooks(CHIEF, _queue_input(settings), settings)
  watch = next(h for h in hooks if isinstance(h, LostWorkerWatch))
  assert list(watch._spare_ids) == [1]  # worker:0, id 1 of chief:0 and worker:0
  too_many = EpochSyncSettings(num_epochs=1, sync=False, elastic=True, save_checkpoint_secs=0,
                               spare_workers=2)
  with tf.Graph().as_default(), pytest.raises(
      ConfigError, match=r"--epochsync_spare_workers=2 leaves no task to train among the "
                         r"2 chief and worker tasks"):
    epoch_sync_hooks(CHIEF, _queue_input(too_many), too_many)


def test_optional_workers_are_the_last_worker_ids_and_join_without_a_spare_count(graph):
  """The chief sets them aside at the start (as it does spares) and the audit names them
  optional; their join counts no spares, so a worker's own fence makes room for it."""
  settings = EpochSyncSettings(num_epochs=1, sync=False, elastic=True, save_checkpoint_secs=0,
                               optional_workers=1)
  hooks = epoch_sync_hooks(CHIEF, _queue_input(settings), settings)
  watch = next(h for h in hooks if isinstance(h, LostWorkerWatch))
  assert list(watch._spare_ids) == [1] and watch._optional
  assert watch._barrier.stand_ins.absent_kind == "optional"
  worker = ClusterConfig(CHIEF.cluster, "worker", 0)
  with tf.Graph().as_default():
    units = [WorkUnit("", 0, 4), WorkUnit("", 4, 8)]
    epoch_input = work_queue_input(units, lambda u: tf.data.Dataset.range(4).batch(2),
                                   num_epochs=1, num_workers=2, worker_id=1,
                                   task_name="worker:0", ps_device="", settings=settings)
    start = next(h for h in epoch_sync_hooks(worker, epoch_input, settings)
                 if isinstance(h, RunStartHook))
    assert start._spare and start._rejoin._optional and start._rejoin._spares == 0


def _growing_hooks(task_type, task_index, worker_hosts, settings):
  """The hooks of a task of a job launched with 2 chief and worker tasks, at most 4."""
  config = ClusterConfig({"chief": ["localhost:1"], "worker": worker_hosts,
                          "ps": ["localhost:3"]}, task_type, task_index, launch_workers=2,
                         max_workers=4)
  with tf.Graph().as_default():
    units = [WorkUnit("", 0, 4), WorkUnit("", 4, 8)]
    epoch_input = work_queue_input(units, lambda u: tf.data.Dataset.range(4).batch(2),
                                   num_epochs=1, num_workers=4, worker_id=config.worker_id,
                                   task_name=config.task_name, ps_device="", settings=settings)
    return epoch_sync_hooks(config, epoch_input, settings)


def test_a_job_that_may_grow_sets_the_slots_past_its_launch_aside_and_their_workers_announce():
  """The chief starts without worker:1 and worker:2 (no task of the launch knows their
  addresses) and learns each one's address at its join; a worker beyond the launch writes its
  own before it joins, one of the launch does not."""
  settings = EpochSyncSettings(num_epochs=1, sync=False, elastic=True, save_checkpoint_secs=0)
  watch = next(h for h in _growing_hooks("chief", 0, ["localhost:2"], settings)
               if isinstance(h, LostWorkerWatch))
  assert list(watch._spare_ids) == [2, 3] and watch._optional
  assert watch._unaddressed == {"worker:1", "worker:2"} and watch._addresses is not None
  for index, announces in ((0, False), (1, True)):
    start = next(h for h in _growing_hooks("worker", index, ["localhost:2", "localhost:4"],
                                           settings) if isinstance(h, RunStartHook))
    assert (start._rejoin._announce is not None) == announces, index
    assert start._spare == announces and start._rejoin._spares == 0
  with pytest.raises(ConfigError, match=r"--epochsync_max_workers=4 needs --epochsync_elastic"):
    _growing_hooks("chief", 0, ["localhost:2"], EpochSyncSettings(
        num_epochs=1, sync=False, save_checkpoint_secs=0))
  with pytest.raises(ConfigError, match=r"--epochsync_max_workers=4 with "
                                        r"--epochsync_spare_workers=1"):
    _growing_hooks("chief", 0, ["localhost:2"], EpochSyncSettings(
        num_epochs=1, sync=False, save_checkpoint_secs=0, elastic=True, spare_workers=1))


class _Monitor:
  """A LivenessMonitor's answers for the chief's watch: `down` tasks refuse their probes."""

  def __init__(self):
    self.down, self.answered = set(), set()
    self.addresses = dict.fromkeys(["chief:0", "worker:0", "worker:1"], "localhost:1")
    self.given = frozenset(self.addresses)

  def probe(self, names):
    self.answered |= {n for n in names if n not in self.down}

  def never_answered(self, names):
    return [n for n in names if n not in self.answered]

  def dead(self, names, known_up=(), stalled_after_secs=None):
    self.probe(names)
    return [(n, "its server is gone") for n in names if n in self.down and n in self.answered]

  def forget(self, name):
    self.answered.discard(name)


class _Barrier:
  epoch = 0

  def start_epoch(self, session):
    return self.epoch


def test_a_spare_gone_while_it_stands_by_is_named_until_a_new_process_answers(caplog):
  monitor, barrier = _Monitor(), _Barrier()
  watch = LostWorkerWatch(None, barrier, monitor, ["chief:0", "worker:0", "worker:1"], 60.0,
                          spare_ids=[2], num_epochs=2)
  watch._spares = {"worker:1"}  # as after_create_session's _lose(spare=True) leaves it
  said = lambda: [(r.levelname, r.getMessage()) for r in caplog.records if "worker:1" in
                  r.getMessage()]
  watch._watch_spares(None)  # up: nothing to say
  monitor.down.add("worker:1")
  watch._watch_spares(None)
  watch._watch_spares(None)  # still gone: said once
  assert said() == [("WARNING", "worker:1, a spare standing by, is gone (its server is gone); "
                     "the job has no spare in its place until a process of worker:1 answers "
                     "again (relaunch it)")]
  assert watch._gone_spares == {"worker:1"}
  monitor.down.clear()  # its relaunched process answers
  watch._watch_spares(None)
  assert said()[1:] == [("INFO", "chief:0: a new process of worker:1, a spare, answers; it "
                         "stands by again")]
  assert not watch._gone_spares
  barrier.epoch, monitor.down = 2, {"worker:1"}  # the job's 2 epochs trained: it ends
  watch._watch_spares(None)
  assert len(said()) == 2 and not watch._gone_spares and watch._stop.is_set()


def test_workers_that_end_after_the_last_epoch_are_not_lost(caplog):
  """The last barrier's release ends the workers while the chief still ends its session: its
  watch must not take them for lost (a WARNING and a reclaim in a healthy job)."""
  monitor, barrier = _Monitor(), _Barrier()
  watch = LostWorkerWatch(None, barrier, monitor, ["chief:0", "worker:0", "worker:1"], 60.0,
                          num_epochs=2)
  barrier.epoch = 2
  monitor.probe(["worker:0", "worker:1"])
  monitor.down = {"worker:0", "worker:1"}
  watch._watch_once(None)  # _lose would run the reclaim in the (None) session
  assert watch._stop.is_set() and not watch._lost
  assert [r.levelname for r in caplog.records] == ["INFO"], caplog.records
