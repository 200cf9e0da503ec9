"""TensorFlow's StepCounterHook for a chief whose global step others' runs advance too.

Stock StepCounterHook warns "global step ... has not been increased" when two of its runs
read the same global step. Its read is not ordered with the run's synchronous update, which
the chief's aggregation (another session run) applies as soon as every active worker's
gradient is in, so a loaded chief may read the step after its own run's update and the next run
read the same value: the warning then fires though every run stepped. This hook reads the step
once more, after the run, before it believes that, and warns only if that read did not move
either.

Typical usage (monitored_training_session and estimator_ext put it on the chief):
  hooks.append(SyncStepCounterHook(output_dir=model_dir, every_n_steps=100))
"""

import tensorflow as tf

__all__ = ["SyncStepCounterHook"]


class SyncStepCounterHook(tf.compat.v1.train.StepCounterHook):
  """tf.compat.v1.train.StepCounterHook without the false "has not been increased" warning.

  Use it wherever a StepCounterHook runs on the chief of a synchronous job; its arguments,
  steps/sec lines and summaries are stock's.

    hooks.append(SyncStepCounterHook(output_dir=model_dir, every_n_steps=100))
  """

  def after_run(self, run_context, run_values) -> None:
    stale = run_values.results
    if stale is not None and stale == self._last_global_step:
      # The read may have raced the run's update: stock warns only if the step is still there.
      if run_context.session.run(self._global_step_tensor) != stale:
        self._last_global_step = None  # This run did step: nothing to warn about.
    super().after_run(run_context, run_values)
