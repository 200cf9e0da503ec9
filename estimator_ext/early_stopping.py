"""Epoch-level early stopping: after which epoch to stop when an eval metric stops improving.

The chief evaluates every epoch in-loop (between the epoch's save and the release of the
workers) and asks `EarlyStoppingState.update` whether to stop; every worker then stops at that
same epoch boundary.

Typical usage:
  config = EpochSyncRunConfig(model_dir=..., num_epochs=20,
                              early_stopping=EarlyStopping(metric="loss", patience=2))
"""

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional

from hooks.errors import ConfigError, raise_if_problems

__all__ = ["EarlyStopping", "EarlyStoppingState"]

_MODES = ("min", "max")


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
  """Stop after the epoch at which `metric` has not improved for `patience` epochs.

  An epoch improves on the best epoch so far if its metric is lower by more than `min_delta`
  ("min") or higher by more than `min_delta` ("max"); the first evaluated epoch always improves.

      EarlyStopping(metric="loss", patience=2)              # stop after 2 epochs without progress
      EarlyStopping(metric="auc", mode="max", min_delta=1e-3)

  Args:
    metric: `str` a key of the eval metrics (e.g. "loss", "average_loss", "auc").
    patience: `int` >= 1, epochs without improvement before stopping.
    mode: `str` "min" (lower is better) or "max".
    min_delta: `float` >= 0, the smallest change that counts as an improvement.

  Raises:
    ConfigError: listing every invalid field with its value and the rule.
  """

  metric: str = "loss"
  patience: int = 1
  mode: str = "min"
  min_delta: float = 0.0

  def __post_init__(self):
    problems = []
    if not isinstance(self.metric, str) or not self.metric:
      problems.append(f"metric={self.metric!r} must be the name of an eval metric, e.g. 'loss'")
    if not isinstance(self.patience, int) or isinstance(self.patience, bool) or self.patience < 1:
      problems.append(f"patience={self.patience!r} must be an integer >= 1")
    if self.mode not in _MODES:
      problems.append(f"mode={self.mode!r} must be 'min' (lower is better) or 'max'")
    if (not isinstance(self.min_delta, (int, float)) or isinstance(self.min_delta, bool) or
        not math.isfinite(self.min_delta) or self.min_delta < 0):
      problems.append(f"min_delta={self.min_delta!r} must be a finite number >= 0")
    raise_if_problems(problems, "EarlyStopping")

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)


class EarlyStoppingState:
  """The best epoch so far and the epochs since; `update` says when to stop.

    state = EarlyStoppingState(EarlyStopping(patience=2))
    reason = state.update(epoch=3, metrics={"loss": 0.25})  # None: go on

  Args:
    rule: the `EarlyStopping` to apply.
  """

  def __init__(self, rule: EarlyStopping):
    self.rule = rule
    self.best: Optional[float] = None
    self.best_epoch: Optional[int] = None
    self.epochs_without_improvement = 0

  def update(self, epoch: int, metrics: Mapping[str, Any]) -> Optional[str]:
    """Records epoch `epoch`'s metrics; returns why to stop after it, or None to go on.

    Raises:
      ConfigError: the metric is not among `metrics`.
    """
    rule = self.rule
    if rule.metric not in metrics:
      raise ConfigError(f"early stopping: metric {rule.metric!r} is not among the eval metrics "
                        f"{sorted(metrics)}; set EarlyStopping(metric=...) to one of them")
    value = float(metrics[rule.metric])
    sign = 1.0 if rule.mode == "min" else -1.0
    if self.best is None or sign * (self.best - value) > rule.min_delta:
      self.best, self.best_epoch, self.epochs_without_improvement = value, epoch, 0
      return None
    self.epochs_without_improvement += 1
    if self.epochs_without_improvement < rule.patience:
      return None
    better = "lower" if rule.mode == "min" else "higher"
    return (f"early stopping: {rule.metric}={value:.6g} in epoch {epoch}; no epoch since epoch "
            f"{self.best_epoch} ({rule.metric}={self.best:.6g}) was {better} by more than "
            f"min_delta={rule.min_delta:g} for {self.epochs_without_improvement} epoch(s) "
            f"(patience {rule.patience})")
