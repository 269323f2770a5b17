"""Schedule a reminder 10 s ahead, revoke another, and move a third: run it beside a worker
and a forwarder (see README.md) and watch the worker's output."""

from datetime import datetime, timedelta, timezone

from proj.celery import app
from proj.tasks import remind

from delayq_backends.celery import get, reschedule

if __name__ == "__main__":
    soon = remind.apply_async(("ada", "stand-up"), countdown=10)
    cancelled = remind.apply_async(("bob", "never sent"), countdown=15)
    moved = remind.apply_async(("cy", "moved from tomorrow"), eta=datetime.now(timezone.utc) + timedelta(days=1))

    cancelled.revoke()  # gone from the delay store at once, and broadcast as Celery does
    reschedule(app, moved.id, datetime.now(timezone.utc) + timedelta(seconds=20))

    for name, result in (("soon", soon), ("cancelled", cancelled), ("moved", moved)):
        item = get(app, result.id)
        when = "not scheduled" if item is None else f"due {datetime.fromtimestamp(item.ready_ms / 1000, timezone.utc)}"
        print(f"{name:9} {result.id}  {when}")
