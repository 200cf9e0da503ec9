"""What a healthy task's log must not hold: a line at WARNING or above (or a traceback) that a
job could avoid. Shared by test_healthy_logs (the demos) and the cluster tests of healthy jobs.

Typical usage:
  assert not alarms(open(log_path).read())
"""

import re

__all__ = ["ALARM", "ALLOWED", "alarms"]

# A line at WARNING or above in any of the formats a task writes, or the start of a traceback.
ALARM = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [WEF] "  # TensorFlow's C++ logging
    r"|^[WEF]\d{4} [\d:.]+ "  # absl's format: Python lines under absl.app.run, and
    # TensorFlow 2.16+'s C++ lines ("W0000 00:00:1795468076.912047    2104 x.cc:412] ...")
    r"|^(WARNING|ERROR|CRITICAL|FATAL):"  # Python logging's default format
    r"|\b\w*Warning: "  # the warnings module (DeprecationWarning: ..., UserWarning: ...)
    r"|^Traceback \(most recent call last\)|^Exception in thread ")

# TensorFlow's own notices no job can avoid; each entry says why. Keep it short.
ALLOWED = [
    # TensorFlow 2.15 marks every tf.compat.v1 training API and all of Estimator deprecated
    # (MonitoredSession's SessionRunArgs, SessionRunContext, the stock hooks, RunConfig,
    # Estimator, EstimatorSpec, TrainSpec, disable_v2_behavior's disable_resource_variables):
    # the very APIs a parameter-server job is written in. Logged once per API and process.
    re.compile(r"(WARNING:tensorflow:|W\d{4} .* deprecation\.py:\d+\] )From .*: \S+ \(from "
               r"tensorflow(_estimator)?\.[\w.]+\) is deprecated and will be removed in a "
               r"future version\.$"),
    # TensorFlow 2.16+'s C++ runtime prints this before its first log line (twice per process
    # on 2.21.0, each time before its oneDNN notice): its absl logging is never initialised
    # from Python (no API a job could call to do it).
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are "
               r"written to STDERR$"),
    # TensorFlow 2.16+ logs the runtime dropping a finished step's leftover tensors at WARNING,
    # a few per job on some tasks; a stock MonitoredTrainingSession job without tf-epochsync
    # logs it too (measured on 2.21.0). 2.15 does not log it.
    re.compile(r"local_rendezvous\.cc:\d+\] Local rendezvous is aborting with status: "
               r"ABORTED: Cleanup \d+"),
    # TensorFlow 2.16+ also logs, at WARNING, every step that is cancelled or aborted while it
    # has tensors in flight, as happens to the runs still pending when a task closes its session
    # (seen on an empty-shard worker and a ps at the end of a 2-ps job). 2.15 logs none of them.
    # Only cancellations: a failed run (e.g. FAILED_PRECONDITION) still fails the test.
    re.compile(r"local_rendezvous\.cc:\d+\] Local rendezvous is aborting with status: "
               r"(CANCELLED: RecvFromRemoteAsync is cancelled\.|ABORTED: Stopping remaining "
               r"executors\.|ABORTED: Step \d+ cancelled\.  Cancelling rendezvous\.)"),
]


def alarms(text):
  """The lines of a log at WARNING or above (or tracebacks) that ALLOWED does not cover."""
  return [line for line in text.splitlines()
          if ALARM.search(line) and not any(a.search(line) for a in ALLOWED)]
