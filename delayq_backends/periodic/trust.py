"""Which periodic run templates an operator defined: trust follows the role that wrote it.

A store item is data any producer credential can write, and most items may only become work a
producer could send anyway (a Celery task message: a producer may send any task). An entry whose
template carries *code to run* is different: an RQ entry's template holds RQ's pickled ``data``
(the function and its arguments), and the forwarder writes it into RQ's Redis, which the
producer cannot reach, where an ``rq worker`` unpickles and runs it. So such a template must come
from an operator.

The trusted definitions ``<prefix>:{<prefix>}:periodic:trusted`` (entry name → the digest of its
template, and the one before) are written only through ``periodic_trust.lua``, which only the
``operator`` and ``forwarder`` roles may call and whose key only they may write (see
:mod:`delayq_backends.acl`): every path that defines an entry (``delayq periodic add``, the HTTP
API, a sync from code) records the digest of the template it built itself, before it stores the
item (:func:`~.ops.upsert`, :func:`~.ops.sync_code`); a run now or a backfill changes no template
and records nothing. The forwarder compares each such item's template with the definitions
before it writes anything to RQ, and dead-letters one that does not match, naming the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..keys import periodic_trust_key
from ..scripts.store import PeriodicTrust
from ..store import DelayStore, PeriodicRecords
from .registry import PeriodicError

__all__ = ["TrustCheck", "UntrustedError", "forget", "record", "trusted_digests"]

#: The commands a dead-letter reason names (the operator's, with the operator credential).
_FIX = (
    "an operator defines it with the operator (or forwarder) credential: `delayq periodic add --kind rq`, "
    "`delayq rq-cron sync`, `delayq forward --rq-cron`, or for an entry stored before this check "
    "`delayq periodic trust {name}` after reviewing it (`delayq periodic show {name}`); then "
    "`delayq dlq requeue {item}`"
)


class UntrustedError(PeriodicError):
    """The trusted definitions cannot be read or written (a hand write): a sync reports it per
    entry and goes on, a forwarder's RQ entries wait."""


def record(store: DelayStore, name: str, digest: str) -> None:
    """Record ``digest`` as entry ``name``'s template (the previous one kept beside it).

    Raises:
        UntrustedError: the key is of another type (a hand write), naming the fix.
        redis.exceptions.NoPermissionError: a credential that may not define code to run.
    """
    if store.scripts.run(PeriodicTrust.call(periodic_trust_key(store.config.prefix), name, digest)) < 0:
        raise UntrustedError(_damaged(store.config.prefix))


def forget(store: DelayStore, names: Iterable[str]) -> None:
    """Drop the definitions of entries ``names`` (removed entries); a damaged key is left as it is."""
    key, names = periodic_trust_key(store.config.prefix), list(names)
    for start in range(0, len(names), PeriodicTrust.MAX_DROP):  # one call per page of a sweep
        store.scripts.run(PeriodicTrust.drop(key, names[start : start + PeriodicTrust.MAX_DROP]))


def _damaged(prefix: str) -> str:
    key = periodic_trust_key(prefix)
    return (
        f"the trusted definitions {key} are not a hash (written by another tool): move them away "
        f"(`redis-cli RENAME {key} {key}:bad`), then define the entries again (`delayq rq-cron sync`, "
        "`delayq periodic trust NAME`)"
    )


def trusted_digests(store: PeriodicRecords, names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The digests an operator defined for each of ``names`` (none for an unknown name).

    Raises:
        UntrustedError: the key is of another type (a hand write).
    """
    names = list(dict.fromkeys(names))
    if not names:
        return {}
    values = store.trusted_values(names)
    if values is None:
        raise UntrustedError(_damaged(store.config.prefix))
    return {n: tuple(_text(v).split()[:2]) for n, v in zip(names, values)}


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("ascii", "replace") if isinstance(value, bytes) else value


@dataclass(frozen=True)
class TrustCheck:
    """The forwarder's check of one claim's items against the definitions: ``wanted`` maps an
    item id to its entry's name and its template's digest; :meth:`refused` says, per item id,
    why it may not become work (nothing for the items that may)."""

    what: str  # "RQ periodic entry", "RQ run": for the reasons

    def refused(self, store: PeriodicRecords, wanted: Mapping[str, tuple[str, str]]) -> dict[str, str]:
        """Raises UntrustedError when the definitions cannot be read (the items wait)."""
        digests = trusted_digests(store, (name for name, _ in wanted.values()))
        out = {}
        for item, (name, digest) in wanted.items():
            if digest not in digests.get(name, ()):
                defined = "no definition" if not digests.get(name) else "another definition"
                out[item] = (
                    f"{self.what} {name!r}: its job template is not the one an operator defined ({defined} in "
                    f"{periodic_trust_key(store.config.prefix)}): written by a credential that may not define code "
                    f"to run, so nothing was sent to RQ. If it is yours, {_FIX.format(name=name, item=item)}"
                )
        return out
