"""``rq cron`` configs read exactly as RQ reads them: each config below is loaded by the installed
RQ's own loader (``rq.cron.CronScheduler.load_config_from_file``, what ``rq cron CONFIG`` runs)
and by delayq's (``delayq_backends.rq.cron.load_config``), and both must yield the same jobs, in
the same order: function, queue, arguments, schedule, job options and name. RQ 3 keeps every
registration, several of one name (a function registered twice without ``name=``); delayq keeps
them all too, the second of a name as ``name#2`` (an entry's name is its key in the store)."""

from __future__ import annotations

import logging
import pickle
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.cron import CronJob, CronScheduler

from delayq_backends.periodic.schedules import Cron, Every
from delayq_backends.rq.cron import CronEntry, load_config

HEAD = "from rq import cron\nfrom delayq_backends.rq import cron as delayq_cron\nfrom tests.test_rq import jobs\n"
CONFIGS = {
    "twice_without_name": """
        cron.register(jobs.record, "q1", args=("a",), interval=60)
        cron.register(jobs.record, "q1", args=("b",), interval=30)
        cron.register(jobs.record, "q2", kwargs={"times": 3}, cron="*/5 * * * *")
    """,
    "named_and_unnamed": """
        cron.register(jobs.record, "q1", args=("a",), interval=60, name="report")
        cron.register(jobs.record, "q1", args=("b",), interval=60, name="report")
        cron.register(jobs.record, "q1", args=("c",), interval=60)
        cron.register(jobs.hold, "q1", args=("d", 0), cron="0 9 1 * 1")
    """,
    "job_options": """
        cron.register(jobs.record, "q1", args=("a",), interval=10, job_timeout=30, result_ttl=60, ttl=20,
                      failure_ttl=3600, meta={"owner": "ops"})
        cron.register(jobs.record, "q1", args=("b",), interval=10, result_ttl=-1)
    """,
    "delayq_register_and_a_bad_one": """
        delayq_cron.register(jobs.record, "q1", args=("a",), interval=60, tz="UTC", misfire="run_all")
        cron.register(jobs.record, "q1", args=("bad",), interval=60, cron="* * * * *")
        delayq_cron.register(jobs.record, "q1", args=("c",), cron="30 2 * * *", tz="UTC")
        cron.register(jobs.record, "q1", args=("d",), interval=60)
    """,
}


def _rq_job(job: CronJob) -> dict[str, Any]:
    """A job as RQ's loader registered it: what ``rq cron`` enqueues at each period."""
    options = job.job_options
    return {
        "name": job.name,
        "func": job.func_name,
        "queue": job.queue_name,
        "args": tuple(job.args),
        "kwargs": dict(job.kwargs),
        "interval": job.interval,
        "cron": job.cron,
        "timeout": options.get("job_timeout") or Queue.DEFAULT_TIMEOUT,  # RQ's enqueue: the queue's default
        "result_ttl": options["result_ttl"],
        "ttl": options.get("ttl"),
        "failure_ttl": options.get("failure_ttl"),
        "meta": options.get("meta") or {},
    }


def _ours(entry: CronEntry) -> dict[str, Any]:
    """An entry as delayq's loader made it, in the same terms (its job data unpickled)."""
    template = entry.template
    func, _instance, args, kwargs = pickle.loads(zlib.decompress(template.data))
    schedule = entry.schedule
    return {
        "name": entry.name.split("#")[0],
        "func": func,
        "queue": template.queue,
        "args": tuple(args),
        "kwargs": dict(kwargs),
        "interval": schedule.every_ms // 1000 if isinstance(schedule, Every) else None,
        "cron": schedule.expression if isinstance(schedule, Cron) else None,
        "timeout": template.fields.get("timeout"),
        "result_ttl": template.fields.get("result_ttl"),
        "ttl": template.ttl,
        "failure_ttl": template.fields.get("failure_ttl"),
        "meta": dict(template.meta),
    }


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_config_yields_the_jobs_rqs_own_loader_yields(tmp_path: Path, config: str) -> None:
    path = tmp_path / f"{config}.py"
    path.write_text(HEAD + textwrap.dedent(CONFIGS[config]))
    rq_itself = CronScheduler(connection=redis.Redis(host="never-connects.invalid"), logging_level=logging.CRITICAL)
    rq_itself.load_config_from_file(str(path))
    loaded = load_config(str(path))
    assert [_ours(e) for e in loaded.entries] == [_rq_job(j) for j in rq_itself.get_jobs()]
    names = [e.name for e in loaded.entries]
    assert len(set(names)) == len(names), "each entry its own name in the store"
    if config == "delayq_register_and_a_bad_one":  # RQ logs it and goes on; delayq names it and goes on
        assert list(loaded.errors) == ["tests.test_rq.jobs.record#2"]
        assert "interval and cron" in loaded.errors["tests.test_rq.jobs.record#2"]


def test_the_same_function_twice_without_a_name_is_two_entries_numbered_in_order(tmp_path: Path) -> None:
    path = tmp_path / "twice.py"
    path.write_text(HEAD + textwrap.dedent(CONFIGS["twice_without_name"]))
    loaded = load_config(str(path))
    assert [e.name for e in loaded.entries] == [
        "tests.test_rq.jobs.record",
        "tests.test_rq.jobs.record#2",
        "tests.test_rq.jobs.record#3",
    ]
    assert [e.schedule for e in loaded.entries[:2]] == [Every(60_000), Every(30_000)]
    assert loaded.errors == {}
