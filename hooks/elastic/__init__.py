"""Elastic training: a lost worker does not stop the job (docs/elastic.md).

  from hooks.elastic import LostWorkerWatch   # the chief's; hooks.session.wiring adds it
"""

from hooks.elastic.fence_check import FenceCheckHook
from hooks.elastic.lost_workers import LostWorkerWatch
from hooks.elastic.rejoin import GuestTakeInHook, Rejoin

__all__ = ["LostWorkerWatch", "FenceCheckHook", "Rejoin", "GuestTakeInHook"]
