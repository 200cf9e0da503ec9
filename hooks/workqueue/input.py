"""An EpochInput over a work queue: the epoch's units handed to whichever worker is free.

Instead of a static shard, each worker trains the units it claims from a queue on ps:0
(hooks.workqueue.queue_graph), one pass per unit, until none is left; every unit is trained
exactly once per epoch, and the queue is saved in every checkpoint. The rest of the job (the
done signal, the barrier, the chief's save, the sync optimizer) works unchanged: a worker's
epoch ends when the queue has no unit left for it.

Typical usage (build it inside the worker's graph, as EpochInput):
  units = hooks.workqueue.units_of_files(sorted(glob.glob("/data/part-*.tfrecord")))
  epoch_input = work_queue_input(units, unit_fn, num_epochs=3, num_workers=config.num_workers,
                                 worker_id=config.worker_id, task_name=config.task_name)
  features, labels = epoch_input.get_next()
  hooks = epoch_sync_hooks(config, epoch_input, settings, model_dir=model_dir)
"""

import dataclasses
from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from hooks.config import flags as epochsync_flags
from hooks.config.settings import EpochSyncSettings
from hooks.data.epoch_input import EpochInput
from hooks.errors import ConfigError, raise_if_problems
from hooks.workqueue import elastic_graph, queue_graph
from hooks.workqueue.claims import UnitClaims, process_identity
from hooks.workqueue.replay import UnitReplay
from hooks.workqueue.unit_passes import QueueBuild, UnitPasses
from hooks.workqueue.units import UnitTensors, WorkUnit, fingerprint, unit_problems

__all__ = ["work_queue_input", "WorkQueueSpec", "PS_DEVICE"]

_v1 = tf.compat.v1
PS_DEVICE = "/job:ps/task:0"


@dataclasses.dataclass(frozen=True)
class WorkQueueSpec:
  """A work queue's description, before a task builds it (an Estimator's input_fn returns one:
  estimator_ext.work_units). Fields as work_queue_input's arguments."""
  units: Sequence[WorkUnit]
  unit_fn: Callable[[UnitTensors], tf.data.Dataset]
  seed: Optional[int] = None  # None: the settings' (--epochsync_unit_seed, ...)
  shuffle: Optional[bool] = None
  claim_timeout_secs: Optional[float] = None
  records_are_examples: bool = True
  replay: Optional[UnitReplay] = None

  def problems(self) -> List[str]:
    """What is wrong with the units or unit_fn, naming each; [] when nothing is. Checked once
    per spec (each file's existence is a filesystem call)."""
    if "_problems" not in self.__dict__:  # frozen: cached past __setattr__
      problems = unit_problems(self.units)
      if not callable(self.unit_fn):
        problems.append(f"unit_fn={self.unit_fn!r} must be a function UnitTensors -> "
                        "tf.data.Dataset")
      self.__dict__["_problems"] = problems
    return list(self.__dict__["_problems"])

  def first_unit_dataset(self) -> Any:
    """What `unit_fn` returns for the first unit (built in the current graph), to check it."""
    unit = self.units[0]
    return self.unit_fn(UnitTensors(tf.constant(0, tf.int64), tf.constant(unit.path),
                                    tf.constant(unit.start, tf.int64),
                                    tf.constant(unit.count, tf.int64)))

  def epoch_input(self, num_epochs: int, num_workers: int, worker_id: int, task_name: str,
                  ps_device: str = PS_DEVICE,
                  settings: Optional[EpochSyncSettings] = None) -> EpochInput:
    """The EpochInput of worker `worker_id` over this queue (on `ps_device`; "" in one process);
    the knobs left None come from `settings` (default: the --epochsync_* flags and
    EPOCHSYNC_* variables)."""
    raise_if_problems(self.problems(), f"work units of {task_name}")
    settings = settings or epochsync_flags.settings_from_flags()
    seed = settings.unit_seed if self.seed is None else self.seed
    shuffle = settings.unit_shuffle if self.shuffle is None else self.shuffle
    timeout = (settings.claim_timeout_secs if self.claim_timeout_secs is None else
               self.claim_timeout_secs)
    if not 0 <= worker_id < num_workers:
      raise ConfigError(f"worker_id={worker_id} must be in [0, num_workers={num_workers})")
    units = list(self.units)
    with tf.name_scope("epochsync_units"):
      unit = _v1.placeholder_with_default(tf.constant(-1, tf.int64), [], "unit")
      batches_of = _batches_of(units, self.unit_fn)
      dataset = tf.data.Dataset.from_tensors(unit).filter(_is_unit).flat_map(batches_of)
      probe = _v1.placeholder(tf.int64, [], "probe_unit")  # unit_fn must give one pass
      cardinality = (probe, batches_of(probe).cardinality())
    ops = queue_graph.build(len(units), num_workers, seed, shuffle, ps_device, fingerprint(units),
                            elastic=settings.elastic)
    # Elastic: an asynchronous step's batch passes the queue's gate; a synchronous step's
    # marker does instead, in the sync optimizer built after this (hooks.sync.elastic_steps).
    gate_batches = settings.elastic and not settings.sync
    if settings.elastic and settings.sync:
      elastic_graph.register(ops)
    asynchronous = settings.elastic and not settings.sync
    identity = process_identity() if asynchronous else None
    take_slot = elastic_graph.take_slot(ops, worker_id) if asynchronous else None
    claims = UnitClaims(ops, worker_id, task_name, timeout, identity=identity,
                        take_slot=take_slot)
    if asynchronous:  # For an ElasticOptimizer built after it (hooks.sync.elastic_apply).
      elastic_graph.register_asynchronous(ops, worker_id, identity)
    passes = UnitPasses(claims, unit, units, task_name, self.records_are_examples, cardinality,
                        self.replay, gate_batches=gate_batches,
                        built=QueueBuild(num_workers, settings.elastic, settings.sync))
    return EpochInput(dataset, num_epochs, task_name, passes=passes)


def work_queue_input(units: Sequence[WorkUnit], unit_fn: Callable[[UnitTensors], tf.data.Dataset],
                     num_epochs: int, num_workers: int, worker_id: int, task_name: str,
                     seed: Optional[int] = None, shuffle: Optional[bool] = None,
                     claim_timeout_secs: Optional[float] = None,
                     records_are_examples: bool = True, ps_device: str = PS_DEVICE,
                     replay: Optional[UnitReplay] = None,
                     settings: Optional[EpochSyncSettings] = None) -> EpochInput:
  """An EpochInput whose epochs are the `units`, handed out through a queue on `ps_device`.

  Args:
    units: the epoch's `WorkUnit`s (files or record ranges); checked now (empty, duplicates,
      missing files).
    unit_fn: `UnitTensors -> tf.data.Dataset`, the batches of one unit (parse and batch; one
      pass, not repeated). Batches never span two units.
    num_epochs: `int`, epochs to train.
    num_workers, worker_id: this job's training workers and this worker's id (ClusterConfig).
    task_name: e.g. "worker:1", in logs.
    seed: `int`, the order of the units in each epoch is drawn from (seed, epoch); default
      `settings.unit_seed` (--epochsync_unit_seed, EPOCHSYNC_UNIT_SEED; 0).
    shuffle: `bool`, False: the units' order as given, every epoch; default
      `settings.unit_shuffle` (--epochsync_unit_shuffle; True).
    claim_timeout_secs: `float`, how long a claim may go unanswered before ClaimTimeoutError;
      default `settings.claim_timeout_secs` (--epochsync_claim_timeout_secs; 600).
    records_are_examples: `bool`, the chief's audit requires each record range to yield as
      many examples as it holds records; False if `unit_fn` filters on purpose.
    ps_device: where the queue lives.
    replay: a `UnitReplay` (hooks.workqueue.replay): each worker takes the units a recorded
      audit says it trained, in that order.
    settings: `EpochSyncSettings` for the knobs left None; default
      `hooks.config.flags.settings_from_flags()`.

  Raises:
    ConfigError: bad units or arguments, naming each problem.
  """
  spec = WorkQueueSpec(units, unit_fn, seed, shuffle, claim_timeout_secs, records_are_examples,
                       replay)
  return spec.epoch_input(num_epochs, num_workers, worker_id, task_name, ps_device, settings)


def _batches_of(units: Sequence[WorkUnit], unit_fn):
  """flat_map's function: a unit's index -> unit_fn's dataset of its batches."""
  paths = tf.constant([u.path for u in units], tf.string)
  starts = tf.constant([u.start for u in units], tf.int64)
  counts = tf.constant([u.count for u in units], tf.int64)

  @tf.autograph.experimental.do_not_convert
  def batches_of(index):
    dataset = unit_fn(UnitTensors(index, paths[index], starts[index], counts[index]))
    if not isinstance(dataset, tf.data.Dataset):
      raise ConfigError(f"unit_fn returned {type(dataset).__name__}; it must return the "
                        "tf.data.Dataset of one unit's batches")
    return dataset

  return batches_of


@tf.autograph.experimental.do_not_convert
def _is_unit(index: tf.Tensor) -> tf.Tensor:
  return index >= 0
