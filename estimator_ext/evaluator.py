"""The evaluator task: evaluates every epoch checkpoint exactly once, in order, then exits.

The chief writes `<model_dir>/epochsync_run.json` (the settings every task must agree on) before
training and one audit line per epoch after its barrier (`hooks.epoch.audit`). The evaluator checks its
own settings against the record, then for epoch 0, 1, ... waits (bounded) until the audit shows
the epoch, evaluates that epoch's checkpoint, and appends an eval line; it stops after the last
epoch (or the epoch the chief stopped early at). After a restart it resumes after the epochs its
eval log already holds.

Typical usage (what estimator_ext.train_and_evaluate runs on the `evaluator` task):
  results = run_evaluator(estimator, eval_spec, config)
"""

import glob
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from estimator_ext import eval_log
from estimator_ext import exit_record
from hooks.faults import heartbeat
from hooks import log as logging
from hooks.epoch.audit import read_audit
from hooks.errors import ConfigError, SyncTimeoutError, TaskDiedError, raise_if_problems
from hooks.faults.liveness import LivenessMonitor

__all__ = ["EvaluatorTimeoutError", "RUN_RECORD_FILENAME", "write_run_record", "read_run_record",
           "check_run_record", "chief_monitor", "training_progress", "run_evaluator"]

RUN_RECORD_FILENAME = "epochsync_run.json"
_POLL_SECS = 0.5
# Where each compared setting comes from, for the fix in a mismatch message.
_SOURCES = {"num_epochs": "--epochsync_num_epochs / EpochSyncRunConfig(num_epochs=...)",
            "sync": "--epochsync_sync / EpochSyncRunConfig(sync=...)",
            "divide_by_initial_workers": "--epochsync_divide_by_initial_workers / "
                                         "EpochSyncRunConfig(divide_by_initial_workers=...)",
            "worker_names": 'TF_CONFIG["cluster"]',
            "early_stopping": "EpochSyncRunConfig(early_stopping=...)"}


class EvaluatorTimeoutError(SyncTimeoutError):
  """The evaluator waited too long for the chief (its run record or an epoch checkpoint)."""


def write_run_record(model_dir: str, config) -> str:
  """The chief, before training: writes `config.run_record()`; returns the path."""
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, RUN_RECORD_FILENAME)
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(json.dumps(dict(config.run_record(), chief=config.task_name,
                            written_at=time.time()), sort_keys=True))
  return path


def read_run_record(model_dir: str) -> Optional[Dict[str, Any]]:
  """The chief's run record, or None if it has not written one (yet)."""
  path = os.path.join(model_dir, RUN_RECORD_FILENAME)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    text = f.read()
  try:
    return json.loads(text)
  except json.JSONDecodeError:  # Being written right now; the next poll reads it whole.
    return None


def check_run_record(record: Dict[str, Any], config, path: str) -> None:
  """Raises one ConfigError naming every setting this task disagrees on with the chief's record."""
  mine = config.run_record()
  chief = record.get("chief", "the chief")
  problems = [f"{key}={mine[key]!r} on {config.task_name} but {record.get(key)!r} on {chief} "
              f"(from {path}); start every task with the same {_SOURCES[key]}"
              for key in _SOURCES if mine[key] != record.get(key)]
  raise_if_problems(problems, f"{config.task_name} settings")


def _checkpoint_of(model_dir: str, epoch: int, audit: List[Dict[str, Any]]) -> Optional[str]:
  for line in audit:
    if line["epoch"] == epoch and line.get("checkpoint"):
      return line["checkpoint"]
  found = sorted(glob.glob(os.path.join(model_dir, f"model.ckpt-epoch{epoch:04d}-*.index")))
  return found[-1][:-len(".index")] if found else None


def chief_monitor(config) -> Optional[LivenessMonitor]:
  """A LivenessMonitor of the training tasks (chief first), from the evaluator (None: local)."""
  cluster = config.epochsync_cluster
  if cluster is None:
    return None
  addresses = {}
  for name in config.worker_names:
    job, index = name.split(":")
    addresses[name] = cluster.cluster[job][int(index)]
  return LivenessMonitor(addresses, config.task_name)


def training_progress(config) -> Optional[Callable[[], Any]]:
  """The evaluator's reader of the training tasks' heartbeats on ps:0 (None: local)."""
  cluster = config.epochsync_cluster
  if cluster is None or not cluster.cluster.get("ps"):
    return None
  return heartbeat.remote_reader("grpc://" + cluster.cluster["ps"][0], len(config.worker_names))


def _failed_training_tasks(model_dir: str, since: float,
                           liveness: Optional[LivenessMonitor]) -> Dict[str, str]:
  """{task: its error} of the training tasks that failed after `since` and do not answer."""
  failed = {name: r["error"] for name, r in exit_record.read_all(model_dir).items()
            if r.get("written_at", 0) >= since}
  if failed and liveness is not None:  # One that answers again was restarted: not failed.
    known = [n for n in failed if n in liveness.addresses]
    for name, answer in liveness.probe(known).items():
      if answer.state == "up":
        del failed[name]
  return failed


class _Waiter:
  """The evaluator's waits for what the chief writes to model_dir, polled every 0.5 s: bounded
  by the training tasks' progress (else elapsed time), ended early by a dead chief or a failed
  training task (its exit record), logging what it waits for every log period."""

  def __init__(self, model_dir: str, config, liveness: Optional[LivenessMonitor],
               clock: Callable[[], float], sleep: Callable[[float], None],
               progress: Optional[Callable[[], Any]]):
    self._model_dir, self._config, self._liveness = model_dir, config, liveness
    self._clock, self._sleep, self._progress = clock, sleep, progress
    self._task, self._chief = config.task_name, config.worker_names[0]
    self.since = 0.0  # Exit records older than this belong to an earlier run.

  def wait_for(self, found: Callable[[], Any], what: str, limit: float, flag: str,
               progress: Callable[[], str]) -> Any:
    """found()'s first non-None value, polled every 0.5 s for at most `limit` seconds (without
    progress of the training tasks, when their heartbeats are read)."""
    clock, settings, names = self._clock, self._config.settings, self._config.worker_names
    logging.info("%s waiting for %s in %s", self._task, what, self._model_dir)
    waited_from, next_log = clock(), clock() + settings.log_every_secs
    watch = self._progress and heartbeat.ProgressWatch(self._progress, names, clock)
    everyone = range(len(names))
    value = found()
    while value is None and clock() - (watch.moved_at if watch else waited_from) < limit:
      if watch:
        watch.observe(everyone)
      if clock() >= next_log:
        next_log = clock() + settings.log_every_secs
        waited = clock() - waited_from
        stalled = clock() - watch.moved_at if watch else waited
        level = logging.WARNING if stalled > settings.warn_after_secs else logging.INFO
        logging.log(level, "%s still waiting for %s after %.0f s: %s%s", self._task, what,
                    waited, progress(), f"; {watch.describe(everyone)}" if watch else "")
      if self._ended_early(found, what):
        return found()
      self._sleep(_POLL_SECS)
      value = found()
    if value is None:
      quiet = f", the last {limit:g} s without progress of the training tasks," if watch else ""
      detail = f"; {watch.describe(everyone)}" if watch else ""
      message = (f"{self._task} timed out after {clock() - waited_from:.0f} s{quiet} (limit "
                 f"{limit:g} s) waiting for {what} in {self._model_dir}: {progress()}{detail}; "
                 f"missing {self._chief} (check its log, that every task has the same "
                 f"model_dir, or raise {flag})")
      logging.error(message)
      raise EvaluatorTimeoutError(message, [self._chief])
    return value

  def _ended_early(self, found: Callable[[], Any], what: str) -> bool:
    """True if the wait is over because its value came as the chief or a training task ended;
    raises TaskDiedError if they ended without it."""
    if self._liveness is not None:
      try:
        self._liveness.check([self._chief], f"for {what}")
      except TaskDiedError:
        if found() is None:  # What it waited for may have come just before the chief exited.
          raise
        return True
    failed = _failed_training_tasks(self._model_dir, self.since, self._liveness)
    if not failed:
      return False
    if found() is None:
      errors = "; ".join(f"{name}: {error}" for name, error in sorted(failed.items()))
      message = (f"{self._task} stopped waiting for {what} in {self._model_dir}: training "
                 f"task(s) {', '.join(sorted(failed))} failed ({errors}); fix that and restart "
                 "the whole job (every task) from the same model_dir")
      logging.error("%s", message)
      raise TaskDiedError(message, sorted(failed)[0], f"for {what}")
    return True


def _evaluate_epoch(estimator, eval_spec, task: str, epoch: int, audit: List[Dict[str, Any]],
                    num_epochs: int) -> Dict[str, Any]:
  """Evaluates and exports epoch `epoch`'s checkpoint; appends and returns its eval line."""
  checkpoint = _checkpoint_of(estimator.model_dir, epoch, audit)
  if checkpoint is None or not tf.io.gfile.exists(checkpoint + ".index"):
    raise ConfigError(f"{task}: epoch {epoch}'s checkpoint {checkpoint} was deleted before it "
                      "was evaluated (the chief keeps RunConfig(keep_checkpoint_max) "
                      "checkpoints); raise keep_checkpoint_max or keep the evaluator up")
  metrics, line = eval_log.evaluate_checkpoint(estimator, eval_spec, epoch, checkpoint, task)
  this = [l for l in audit if l["epoch"] == epoch]
  stop = this[0].get("early_stop") if this else None
  if stop:
    line["early_stop"] = stop
  line["exports"] = eval_log.jsonable(eval_log.export(
      estimator, eval_spec, checkpoint, metrics, is_final=bool(stop) or epoch + 1 == num_epochs))
  eval_log.append_line(estimator, eval_spec, task, line)
  return line


def run_evaluator(estimator, eval_spec, config, liveness: Optional[LivenessMonitor] = None,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep,
                  progress: Optional[Callable[[], Any]] = None) -> List[Dict[str, Any]]:
  """Evaluates epochs 0..num_epochs-1 in order, each once; returns this task's eval lines.

  Args:
    estimator: the `Estimator` (its model_dir is the chief's).
    eval_spec: `tf.estimator.EvalSpec`; throttle_secs and start_delay_secs are not used.
    config: the evaluator's `EpochSyncRunConfig`.
    liveness: probes the chief while waiting (`chief_monitor(config)`): a chief that answered
      once and then died ends the wait within seconds; so does a training task that recorded
      its failure in model_dir (`exit_record`) and does not answer.
    clock, sleep: injected by tests.
    progress: reads the training tasks' heartbeats (`training_progress(config)`): the wait for
      the next epoch then times out only after `evaluator_timeout_secs` without progress of
      any training task (a step, or a save of the chief's). None: elapsed time.

  Raises:
    ConfigError: this task's settings disagree with the chief's run record, or an epoch's
      checkpoint was deleted before it was evaluated (raise keep_checkpoint_max).
    EvaluatorTimeoutError: naming the chief, when its record or the next epoch does not come.
    TaskDiedError: the chief died while the evaluator waited for it, or training tasks failed
      (naming each and its error).
  """
  model_dir, task = estimator.model_dir, config.task_name
  chief = config.worker_names[0]
  settings = config.settings
  start = clock()
  waiter = _Waiter(model_dir, config, liveness, clock, sleep, progress)
  wait_for = waiter.wait_for

  def audit_reaching(epoch: int) -> Optional[List[Dict[str, Any]]]:
    audit = read_audit(model_dir)
    return audit if any(line["epoch"] >= epoch for line in audit) else None

  def saved_epochs() -> str:
    epochs = [line["epoch"] for line in read_audit(model_dir)]
    return f"{chief} saved epochs {epochs}" if epochs else f"{chief} saved no epoch yet"

  # A failure recorded before this evaluator started and before the chief's run record belongs
  # to an earlier run (each training task clears its own record when it starts).
  started_at = time.time()
  record_path = os.path.join(model_dir, RUN_RECORD_FILENAME)
  record = wait_for(lambda: read_run_record(model_dir), f"{chief}'s run record",
                    settings.startup_timeout_secs, "--epochsync_startup_timeout_secs",
                    lambda: f"{chief} has not started training")
  check_run_record(record, config, record_path)
  waiter.since = min(started_at, record.get("written_at", 0.0))
  done = {line["epoch"]: line for line in eval_log.read_eval_log(model_dir, task,
                                                                 eval_spec.name)}
  if done:
    logging.info("%s: epochs %s were evaluated in an earlier run", task, sorted(done))
  lines: List[Dict[str, Any]] = []
  epoch, num_epochs = 0, settings.num_epochs
  while epoch < num_epochs:
    if epoch in done:
      if done[epoch].get("early_stop"):
        break
      epoch += 1
      continue
    audit = wait_for(lambda e=epoch: audit_reaching(e), f"epoch {epoch}'s checkpoint",
                     config.evaluator_timeout_secs,
                     "EpochSyncRunConfig(evaluator_timeout_secs=...)", saved_epochs)
    stopped = [l for l in audit if l.get("early_stop") and l["epoch"] < epoch]
    if stopped:  # The chief stopped training early; there is no epoch `epoch`.
      break
    lines.append(_evaluate_epoch(estimator, eval_spec, task, epoch, audit, num_epochs))
    if lines[-1].get("early_stop"):
      break
    epoch += 1
  logging.info("%s evaluated epochs %s in %.1f s; done", task, [l["epoch"] for l in lines],
               clock() - start)
  return lines
