"""Entries moved in from another scheduler (``delayq periodic import``), whatever it was: the
diff of what an import adds, changes, leaves and refuses, and the import itself.

The readers of each scheduler (celery-redbeat, django-celery-beat: ``celery/imports.py``; an
``rq cron`` config: ``rq/cron.py``) turn its entries into :class:`~.ops.EntrySpec` records, with
the run history they carry (:class:`~.ops.Carried`), and name the ones that cannot be moved
(a solar schedule, an option a periodic run cannot have) with why. This module compares them
with the store and writes them: imported entries are runtime entries (the old scheduler's
store stops being the truth; `delayq periodic update` changes them from then on), written by
:func:`~.ops.upsert` one by one, so an import run again, or after a failure halfway, adds what
is missing and changes nothing else. An ``rq cron`` config stays a code schedule
(:func:`~.ops.sync_code`: the config file remains the truth), so its diff also lists the code
entries the sync would remove.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..store import DelayStore
from .ops import CodeEntryError, EntrySpec, SyncReport, item_id, preview, upsert
from .registry import PeriodicError, read_registry
from .sync import code_fingerprint_of

__all__ = ["OUTCOMES", "ImportReport", "import_entries", "preview_sync", "synced"]

#: what an import did (or, in a dry run, would do) with each entry, in the order listed
OUTCOMES = ("added", "changed", "unchanged", "removed", "refused")


@dataclass
class ImportReport:
    """An import's diff, by entry name: ``refused`` maps a name to why it was not moved."""

    source: str
    dry_run: bool = False
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """One line per entry, ``<outcome>: <name>`` (a refusal with its reason), by outcome."""
        out = []
        for outcome in OUTCOMES[:-1]:
            out += [f"{outcome}: {name}" for name in getattr(self, outcome)]
        return out + [f"refused: {name}: {why}" for name, why in sorted(self.refused.items())]

    def describe(self) -> str:
        counts = ", ".join(f"{len(getattr(self, k))} {k}" for k in OUTCOMES if k != "removed" or self.removed)
        verb = "would import (dry run, nothing written)" if self.dry_run else "imported"
        return f"{self.source}: {verb}: {counts}"

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "dry_run": self.dry_run, **{k: getattr(self, k) for k in OUTCOMES}}


def import_entries(
    store: DelayStore, specs: Sequence[EntrySpec], refused: Mapping[str, str], *, source: str, dry_run: bool = False
) -> ImportReport:
    """Write ``specs`` (runtime entries) into ``store`` as :func:`~.ops.upsert` does, or with
    ``dry_run`` only say what that would do; ``refused`` (name -> why) are the source's entries
    its reader could not turn into entries. An entry of the same name from code is refused (a
    sync would undo the import): rename one of them."""
    report = ImportReport(source, dry_run, refused=dict(refused))
    for spec in specs:
        try:
            outcome = preview(store, spec) if dry_run else upsert(store, spec)
        except (CodeEntryError, PeriodicError) as exc:
            report.refused[spec.name] = str(exc)
            continue
        if outcome == "newer":
            report.refused[spec.name] = "stored by a newer release of delayq_backends: import it with that one"
        else:
            getattr(report, outcome).append(spec.name)
    return report


def preview_sync(
    store: DelayStore, specs: Sequence[EntrySpec], errors: Mapping[str, str], *, kind: str, source: str
) -> ImportReport:
    """What a sync of code entries ``specs`` of envelope target ``kind`` would do, writing
    nothing: each spec's outcome, and the stored code entries of ``kind`` it lacks (removed;
    none when ``specs`` is empty, which removes nothing)."""
    report = ImportReport(source, True, refused=dict(errors))
    for spec in specs:
        outcome = preview(store, spec)
        if outcome == "shadowed":
            report.refused[spec.name] = "a runtime entry of that name wins over the config's: rename one of them"
        elif outcome == "newer":
            report.refused[spec.name] = "stored by a newer release of delayq_backends: sync it with that one"
        else:
            getattr(report, outcome).append(spec.name)
    names = {s.name for s in specs} | set(errors)
    if specs:
        report.removed = [n for n in read_registry(store).names if n not in names and _is_code(store, n, kind)]
    return report


def synced(report: SyncReport, *, source: str) -> ImportReport:
    """A sync's report as an import's diff."""
    out = ImportReport(source, added=report.added, changed=report.changed, unchanged=report.unchanged)
    out.removed, out.refused = report.removed, dict(report.errors)
    for name in report.shadowed:
        out.refused[name] = "a runtime entry of that name wins over the config's: rename one of them"
    for name in report.newer:
        out.refused[name] = "stored by a newer release of delayq_backends: sync it with that one"
    return out


def _is_code(store: DelayStore, name: str, kind: str) -> bool:
    """Entry ``name`` is stored as a code entry of ``kind`` (a sync without it removes it)."""
    try:
        return code_fingerprint_of(store.get(item_id(name)), kind) is not None
    except ValueError:  # a registry line that can be no item id: the sync's sweep names it
        return False
