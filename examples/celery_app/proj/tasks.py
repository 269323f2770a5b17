"""Tasks of the example."""

from datetime import datetime, timezone

from proj.celery import app


@app.task
def remind(user: str, what: str) -> str:
    line = f"{datetime.now(timezone.utc):%H:%M:%S.%f} reminding {user}: {what}"
    print(line, flush=True)
    return line
