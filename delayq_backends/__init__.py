"""delayq_backends: a reliable, precise, scalable home for Celery's and RQ's delayed jobs.

The package root imports neither celery, rq nor pyspark; their adapters live in
``delayq_backends.celery``, ``delayq_backends.rq`` and ``delayq_backends.spark``.
"""

from .config import Config
from .envelope import Envelope, Group, Slot
from .errors import (
    BatchClosedError,
    BatchError,
    BrokerUnavailable,
    ConfigError,
    DelayqError,
    EnvelopeError,
    InvalidDebounceError,
    InvalidGroupError,
    InvalidGroupPolicyError,
    InvalidIdError,
    InvalidRankError,
    InvalidRateKeyError,
    InvalidSlotError,
    InvalidTimeError,
    NotDurableError,
    PayloadTooLargeError,
    ShardMismatchError,
    StoreFullError,
)
from .group_policies import GroupPolicies
from .models import BatchStatus, Claim, ClaimedItem, Collapsed, DeadLetter, ScheduleCounts, ScheduledItem, ShardStats
from .store import DelayStore

__version__ = "0.4.0"

__all__ = [
    "BatchClosedError",
    "BatchError",
    "BatchStatus",
    "BrokerUnavailable",
    "Claim",
    "ClaimedItem",
    "Collapsed",
    "Config",
    "ConfigError",
    "DeadLetter",
    "DelayStore",
    "DelayqError",
    "Envelope",
    "EnvelopeError",
    "Group",
    "GroupPolicies",
    "InvalidDebounceError",
    "InvalidGroupError",
    "InvalidGroupPolicyError",
    "InvalidIdError",
    "InvalidRankError",
    "InvalidRateKeyError",
    "InvalidSlotError",
    "InvalidTimeError",
    "NotDurableError",
    "PayloadTooLargeError",
    "ScheduleCounts",
    "ScheduledItem",
    "ShardMismatchError",
    "ShardStats",
    "Slot",
    "StoreFullError",
]
