"""``delayq spark …``: schedule rows of a Parquet dataset, export a store snapshot or an audit
stream, and audit the logs.

pyspark is imported when a command runs, so ``delayq`` itself starts without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import click

from ..audit import AuditRecord, read_stream
from ..connection import connect
from ..errors import InvalidTimeError
from ..storespec import StoreSpec
from ..timeutil import parse_iso, to_ms
from .options import ErrorsAsMessages, celery_broker_option, open_store, rq_redis_option, store_options

__all__ = ["spark"]


@click.group(name="spark", cls=ErrorsAsMessages)
def spark() -> None:
    """Bulk scheduling and audits with Apache Spark."""


def _write_jsonl(records: Iterable[AuditRecord], out: str) -> int:
    n = 0
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for record in records:
            f.write(record.to_json() + "\n")
            n += 1
    return n


@spark.command()
@store_options
@click.argument("source", metavar="PARQUET")
@click.option("--id-col", required=True, help="Column of the task/job ids.")
@click.option("--ready-col", required=True, help="Column of the ready times (timestamp, ISO text, epoch s).")
@click.option("--mode", type=click.Choice(["keep", "replace"]), default="keep", show_default=True,
              help="What a re-run does to ids already scheduled.")  # fmt: skip
@click.option("--celery-task", metavar="NAME", help="Target: this Celery task (with --celery-broker).")
@celery_broker_option("The workers' broker_url.")
@click.option("--rq-func", metavar="PATH", help="Target: RQ jobs of this function (with --rq-redis).")
@rq_redis_option("Redis of the RQ queues.")
@click.option("--list-key", metavar="KEY", help="Target: a Redis list (with --body-col).")
@click.option("--body-col", help="Column of the list bodies.")
@click.option("--queue", help="The Celery or RQ queue. [default: Celery's default queue / 'default']")
@click.option("--args-col", help="Column of positional arguments (array or JSON text).")
@click.option("--kwargs-col", help="Column of keyword arguments (struct, map or JSON text).")
@click.option("--rank-col", help="Column of store ranks (0..255, higher forwarded first under a backlog).")
@click.option("--group-col", help="Column of each row's groups: a key, a struct (key, limit, rate, weight, cost) "
              "or an array of up to 3.")  # fmt: skip
@click.option("--rejects", metavar="DIR", help="Write the rejected rows, with their reasons, as Parquet here.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
def schedule(spec: StoreSpec, source: str, id_col: str, ready_col: str, mode: str, rank_col: str | None,
             group_col: str | None, rejects: str | None, master: str, **choice: Any) -> None:  # fmt: skip
    """Schedule one delayed Celery task, RQ job or list item per row of a Parquet dataset."""
    from ..spark.bulk import schedule_dataframe
    from ..spark.session import local_session

    target = _target(**choice)
    session = local_session(master)
    result = schedule_dataframe(
        session.read.parquet(source), url=spec.url, prefix=spec.prefix, shards=spec.shards, target=target,
        id_col=id_col, ready_at_col=ready_col, mode=mode, rank_col=rank_col, group_col=group_col,
    )  # fmt: skip
    c = result.counts
    click.echo(f"added {c.added}, replaced {c.replaced}, kept {c.kept}, rejected {result.rejected}")
    if result.rejected:
        for row in result.rejects.limit(5).collect():
            click.echo(f"  rejected {row['id']!r}: {row['reason']}", err=True)
        if rejects:
            result.rejects.write.mode("overwrite").parquet(rejects)
            click.echo(f"rejected rows written to {rejects}", err=True)


def _target(
    celery_task: str | None,
    celery_broker: str | None,
    rq_func: str | None,
    rq_redis: str | None,
    list_key: str | None,
    body_col: str | None,
    queue: str | None,
    args_col: str | None,
    kwargs_col: str | None,
) -> Any:
    """The one target the options name; a usage error says what is missing."""
    from ..spark.rows import CeleryTask, ListTarget, RQJob

    chosen = [name for name, value in (("--celery-task", celery_task), ("--rq-func", rq_func),
                                       ("--list-key", list_key)) if value]  # fmt: skip
    if len(chosen) != 1:
        raise click.UsageError(f"choose one target: --celery-task, --rq-func or --list-key (got {chosen or 'none'})")
    needs = {"--celery-task": ("--celery-broker", celery_broker), "--rq-func": ("--rq-redis", rq_redis),
             "--list-key": ("--body-col", body_col)}[chosen[0]]  # fmt: skip
    if not needs[1]:
        raise click.UsageError(f"{chosen[0]} needs {needs[0]}")
    if celery_task and celery_broker:
        return CeleryTask(celery_task, broker_url=celery_broker, args_col=args_col, kwargs_col=kwargs_col, queue=queue)
    if rq_func and rq_redis:
        return RQJob(rq_func, redis_url=rq_redis, queue=queue or "default", args_col=args_col, kwargs_col=kwargs_col)
    return ListTarget(body_col=str(body_col), list_key=list_key)


@spark.command()
@store_options
@click.option("--out", required=True, metavar="FILE", help="JSON-lines file to write.")
@click.option(
    "--stream",
    default=None,
    metavar="KEY",
    help="Export this audit stream (delayq forward --audit-stream) instead of the scheduled items.",
)
def export(spec: StoreSpec, out: str, stream: str | None) -> None:
    """Write the store's scheduled items (or an audit stream) as audit records, for `delayq spark audit`.

    Take the snapshot before the items fall due: forwarded items leave the store.
    """
    if stream:
        client = connect(spec.url)
        count = _write_jsonl(read_stream(client, stream), out)
        client.close()
    else:
        from ..spark.audit import snapshot_records

        count = _write_jsonl(snapshot_records(open_store(spec, writes=False)), out)
    click.echo(f"wrote {count} records to {out}")


@spark.command("audit")
@click.option("--scheduled", multiple=True, metavar="PATH", help="Store snapshot(s) from `delayq spark export`.")
@click.option("--forwarded", multiple=True, required=True, metavar="PATH", help="Forwarder audit files or dirs.")
@click.option("--executed", multiple=True, metavar="PATH", help="Worker audit files or directories.")
@click.option("--out", required=True, metavar="DIR", help="Where the Parquet tables and the report go.")
@click.option("--as-of", default=None, metavar="TIME", help="The audit's now (ISO 8601 with offset). [default: now]")
@click.option(
    "--grace",
    type=float,
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="Due this recently is not yet missing.",
)
@click.option(
    "--late",
    type=float,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="Forwarded later than this is listed as late.",
)
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
def audit_(
    scheduled: Sequence[str],
    forwarded: Sequence[str],
    executed: Sequence[str],
    out: str,
    as_of: str | None,
    grace: float,
    late: float,
    master: str,
) -> None:
    """Lateness per queue and hour, and jobs never forwarded, doubled or early: Parquet, PNG, Markdown."""
    from ..spark.audit import audit
    from ..spark.report import write_report
    from ..spark.session import local_session

    try:
        as_of_ms = to_ms(parse_iso(as_of)) if as_of else None
    except InvalidTimeError as exc:
        raise click.BadParameter(str(exc), param_hint="--as-of") from exc
    session = local_session(master)
    result = audit(
        session,
        scheduled=list(scheduled) or None,
        forwarded=list(forwarded),
        executed=list(executed) or None,
        as_of_ms=as_of_ms,
        grace_ms=int(grace * 1000),
        late_ms=int(late * 1000),
    )
    paths = write_report(result, out)
    for name, n in result.anomaly_counts().items():
        click.echo(f"{name}: {n}")
    click.echo(f"report: {paths['markdown']} and {paths['png']}")
