"""Schedule a few RQ jobs through delayq: one-off, retried, periodic. Run from this directory.

python schedule.py [redis://localhost:6379/0]
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone

from redis import Redis
from rq import Retry

from delayq_backends.rq import Queue, Scheduler

url = sys.argv[1] if len(sys.argv) > 1 else "redis://localhost:6379/0"
redis = Redis.from_url(url)
queue = Queue("example", connection=redis)

for user_id, seconds in ((1, 2), (2, 4), (3, 6)):
    due = time.time() + seconds
    queue.enqueue_at(datetime.fromtimestamp(due, tz=timezone.utc), "tasks.remind", user_id, meta={"due": due})

redis.delete("example:flaky")
queue.enqueue("tasks.flaky", "example:flaky", retry=Retry(max=3, interval=[1, 2]))

scheduler = Scheduler(queue=queue)
scheduler.schedule(datetime.now(timezone.utc) + timedelta(seconds=1), "tasks.heartbeat", interval=3, repeat=4)

print(f"scheduled: {scheduler.count()} job(s) waiting in the delay store", flush=True)
