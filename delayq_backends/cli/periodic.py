"""``delayq periodic …`` and ``celery -A proj delayq periodic …``: periodic entries as data.

One set of commands (:func:`periodic_commands`) serves both groups; they differ only in where
the store and the Celery app come from: store options (``--url``, ``--prefix``, ``--shards``)
and a bare Celery app on ``--celery-broker`` for ``delayq``, the app's own settings and routing
for ``celery -A proj``. ``delayq periodic add|update --kind rq`` adds RQ entries too (RQ's Redis
on ``--rq-redis``). The work is :mod:`delayq_backends.periodic.ops`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
import redis

from ..connection import connect_rq
from ..entries import iso
from ..errors import DelayqError
from ..kinds import ENTRY_KINDS, adapter
from ..periodic import ops
from ..periodic.options import OPTION_FIELDS, RQ, RunOptions, check_import_path
from ..periodic.registry import PeriodicError
from ..periodic.schedules import Cron, Misfire, Once, Schedule, interval, zone_named
from ..periodic.state import RUNTIME
from ..store import DelayStore
from ..storespec import StoreSpec
from ..timeutil import parse_iso, to_ms
from .options import PeriodicAccess, closing, json_option, open_store, rq_redis_option, store_options
from .output import Column, echo_json, print_table
from .periodic_history import limit_option, show_history
from .periodic_import import import_command

__all__ = ["PeriodicAccess", "periodic", "periodic_commands", "show_periodic"]

PERIODIC_COLUMNS = [
    Column("entry"),
    Column("task"),
    Column("schedule"),
    Column("misfire"),
    Column("last run"),
    Column("sent"),
    Column("next run"),
    Column("runs", "right"),
    Column("skipped", "right"),
    Column("state"),
]


def show_periodic(store: DelayStore, as_json: bool) -> None:
    """Print the periodic entries of ``store``: schedule, last run, next run, state."""
    entries = ops.statuses(store)
    if as_json:
        echo_json([e.to_json() for e in entries])
        return
    rows = [
        [e.name, e.task, e.schedule, e.misfire, iso(e.last_run_ms), iso(e.last_sent_ms), iso(e.next_run_ms), e.runs,
         _skipped(e), _state(e)]
        for e in entries
    ]  # fmt: skip
    print_table(f"periodic entries of {store.config.prefix!r} (times UTC)", PERIODIC_COLUMNS, rows)


def _state(entry: ops.EntryStatus) -> str:
    extra = [f"{entry.last_missed} missed"] if entry.last_missed else []
    extra += ["runtime"] if entry.source == RUNTIME else []
    extra += [f"{entry.run_now} run(s) asked"] if entry.run_now else []
    extra += [f"{len(entry.backfill)} backfill(s) asked"] if entry.backfill else []
    return ", ".join([entry.state, *extra])


def _skipped(entry: ops.EntryStatus) -> str:
    """Periods an entry's overlap policy skipped, and the policy ("" for entries without one)."""
    return f"{entry.skipped} ({entry.overlap})" if entry.overlap != "allow" or entry.skipped else ""


def _show(entry: ops.EntryStatus, as_json: bool) -> None:
    if as_json:
        echo_json(entry.to_json())
        return
    for key, value in entry.to_json().items():
        shown = iso(value) if key.endswith("_ms") and key != "jitter_ms" and isinstance(value, int) else value
        click.echo(f"{key}: {'-' if shown is None else shown}")


# -- where the store and the app come from ---------------------------------------------------------


celery_broker_option = click.option(
    "--celery-broker",
    envvar="DELAYQ_CELERY_BROKER",
    show_envvar=True,
    default=None,
    help="The workers' broker URL, which decides how add/update route the task (exchange, routing key).",
)


def _plain_options(command: Callable[..., None]) -> Callable[..., None]:
    rq_redis = rq_redis_option("Redis of the RQ queues, for add/update --kind rq (as `delayq forward --rq-redis`).")
    return store_options(rq_redis(celery_broker_option(command)))


def _plain_store(ctx: click.Context, /, where: dict[str, Any]) -> DelayStore:
    spec: StoreSpec = where["spec"]
    return open_store(spec, writes=True)


def _plain_app(ctx: click.Context, /, where: dict[str, Any]) -> Any:
    """A bare Celery app on ``--celery-broker`` (the web producer's way): no user code imported."""
    celery = adapter("celery")
    app = celery.Celery("delayq-cli", set_as_current=False)
    if where.get("celery_broker"):
        app.conf.broker_url = where["celery_broker"]
    ctx.call_on_close(app.close)
    return app


def _plain_rq(ctx: click.Context, /, where: dict[str, Any], store: DelayStore) -> redis.Redis:
    """RQ's Redis on ``--rq-redis``, for an RQ entry (UsageError without it)."""
    url = where.get("rq_redis")
    if not url:
        raise click.UsageError(
            "--kind rq needs --rq-redis URL (or DELAYQ_RQ_REDIS): the Redis of the RQ queues the entry's runs go to"
        )
    connection = connect_rq(url, store)
    if connection is not store.client:
        closing(connection)
    return connection


PLAIN = PeriodicAccess(_plain_options, _plain_store, _plain_app, _plain_rq)


# -- the definition options of add and update ------------------------------------------------------


def _definition(command: Callable[..., None]) -> Callable[..., None]:
    options = [
        click.argument("name"),
        click.option(
            "--kind",
            type=click.Choice(list(ENTRY_KINDS)),
            default="celery",
            show_default=True,
            help="Who runs it: a Celery worker (--task) or an RQ worker (--func, --queue, --rq-redis).",
        ),
        click.option("--task", default=None, help="The Celery task's name (kind celery)."),
        click.option(
            "--func",
            default=None,
            help="The RQ job function's import path, module.function (kind rq). Not checked against an allowlist "
            "(unlike the HTTP API's --rq-allow): whoever runs this command chooses what RQ workers run (its "
            "callbacks too: --on-success, --on-failure).",
        ),
        click.option("--every", type=float, default=None, help="Run every SECONDS."),
        click.option(
            "--aligned/--not-aligned",
            default=None,
            help="--every: run on multiples of the period since the epoch (Celery's relative=True), or one period "
            "after the add. Default: an added entry not aligned, an updated one kept as it was.",
        ),
        click.option(
            "--cron",
            default=None,
            help="Run on a crontab: 'minute hour day-of-month month day-of-week'. Both day fields set: days matching "
            "both (Celery's crontab), or with --kind rq either (cron's, rq cron's).",
        ),
        click.option("--at", "at", default=None, help="Run once, at this ISO 8601 time with its offset (a one-off)."),
        click.option("--args", "args_json", default="[]", show_default=True, help="Arguments, a JSON array."),
        click.option(
            "--kwargs", "kwargs_json", default="{}", show_default=True, help="Keyword arguments, a JSON object"
        ),
        click.option(
            "--queue", default=None, help="The queue to send each run to (default: the app's routing; needed for rq)."
        ),
        click.option("--tz", default=None, help="The crontab's IANA time zone (default: the app's; rq: UTC)."),
        click.option("--start", default=None, help="No run before this ISO 8601 time."),
        click.option("--end", default=None, help="No run after this ISO 8601 time (then the entry is finished)."),
        click.option("--max-runs", type=click.IntRange(min=1), default=None, help="Finished after this many runs."),
        click.option("--jitter", type=click.FloatRange(0, 86400), default=0, help="Spread each run by up to SECONDS."),
        click.option(
            "--misfire",
            type=click.Choice(["run_once", "run_all", "skip"]),
            default=None,
            help="What missed periods do (default run_once).",
        ),  # fmt: skip
        click.option(
            "--overlap",
            type=click.Choice(["allow", "skip", "buffer_one"]),
            default=None,
            help="Whether runs may overlap (default allow).",
        ),  # fmt: skip
        click.option("--paused", is_flag=True, help="Store it paused (resume it to start)."),
        *(
            click.option(f.flag, f.name, default=None, help=f"{f.help} [{f.kind} entries; e.g. {f.flag} {f.example}]")
            for f in OPTION_FIELDS
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _json(flag: str, text: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc.msg}): e.g. {flag} '[1, \"a\"]'", param_hint=flag) from exc
    if not isinstance(value, kind):
        want = "an array" if kind is list else "an object"
        raise click.BadParameter(f"must be {want}, got {type(value).__name__}", param_hint=flag)
    return value


def _time(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return to_ms(parse_iso(text))
    except DelayqError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from exc


def _known_zone(zone: str, *, given: bool) -> None:
    """A crontab's zone checked before its fields, and blamed on ``--tz`` (or on the app's
    ``timezone`` it defaulted to), not on ``--cron``.

    Raises:
        click.BadParameter: naming the zone and what to give instead.
    """
    try:
        zone_named(zone)
    except DelayqError as exc:
        where = "--tz" if given else "--tz (the app's timezone setting, the default)"
        raise click.BadParameter(str(exc), param_hint=where) from exc


def _schedule(d: dict[str, Any], default_zone: Callable[[], str], store: DelayStore) -> Schedule:
    chosen = [flag for flag in ("every", "cron", "at") if d[flag] is not None]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --every SECONDS, --cron 'm h dom mon dow' or --at ISO-TIME")
    if d["tz"] is not None and chosen != ["cron"]:
        raise click.UsageError("--tz applies to --cron only (an interval or a one-off time has no wall clock)")
    if d["aligned"] is not None and chosen != ["every"]:
        raise click.UsageError("--aligned/--not-aligned apply to --every only (an interval's alignment)")
    try:
        if d["every"] is not None:
            return ops.keep_alignment(store, d["name"], interval(d["every"]), d["aligned"])
        if d["cron"] is not None:
            zone = d["tz"] or default_zone()
            _known_zone(zone, given=d["tz"] is not None)
            return Cron.checked(d["cron"], zone, day_or=ENTRY_KINDS[d["kind"]].day_or)  # the kind's reading
    except DelayqError as exc:
        raise click.BadParameter(str(exc), param_hint=f"--{chosen[0]}") from exc
    at = _time("--at", d["at"])
    assert at is not None
    return Once(at)


def _run_options(d: dict[str, Any]) -> RunOptions:
    """The run options the flags of :data:`OPTION_FIELDS` give, checked for the entry's kind.

    Raises:
        click.UsageError: an option of the other kind, or a value it cannot take (naming its flag).
    """
    given = {f.name: d.get(f.name) for f in OPTION_FIELDS}
    try:
        return RunOptions.parse(given, d["kind"])
    except PeriodicError as exc:
        flags = [f.flag for f in OPTION_FIELDS if given[f.name] is not None and str(exc).startswith(f.name)]
        raise click.UsageError(f"{flags[0] if flags else 'run options'}: {exc}") from None


def _entry(
    access: PeriodicAccess, ctx: click.Context, where: dict[str, Any], d: dict[str, Any], store: DelayStore
) -> ops.EntrySpec:
    """The entry the definition options define for ``store``: a Celery one built with the group's
    app, or an RQ one (``--kind rq``)."""
    options = _run_options(d)
    if d["kind"] == RQ:
        if d["task"] is not None:
            raise click.UsageError("--task names a Celery task: an RQ entry names its function with --func")
        if not d["func"] or not d["queue"]:
            raise click.UsageError("--kind rq needs --func module.function and --queue NAME")
        try:
            check_import_path(d["func"], "--func")
        except PeriodicError as exc:
            raise click.UsageError(str(exc)) from None
        if access.rq is None:
            raise click.UsageError("RQ entries are added with `delayq periodic add --kind rq --rq-redis URL ...`")
        _check_workers(access.rq(ctx, where, store), d["queue"])
        return _rq_spec(d, store, options)
    if d["func"] is not None:
        raise click.UsageError("--func names an RQ function: add --kind rq (a Celery entry names its --task)")
    if not d["task"]:
        raise click.UsageError("a Celery entry needs --task NAME (an RQ entry: --kind rq --func module.function)")
    return _spec(access.app(ctx, where), d, store, options)


def _rq_spec(d: dict[str, Any], store: DelayStore, options: RunOptions) -> ops.EntrySpec:
    """An RQ entry from the definition options, its job captured as the HTTP API's (no allowlist:
    an operator's command)."""
    fields = {
        "enabled": False if d["paused"] else None,
        "start_ms": _time("--start", d["start"]),
        "end_ms": _time("--end", d["end"]),
        "max_runs": d["max_runs"],
        "jitter_ms": round(d["jitter"] * 1000),
    }
    spec: ops.EntrySpec = adapter("rq.cron").runtime_entry(
        d["name"], d["func"], queue=d["queue"], schedule=_schedule(d, lambda: "UTC", store),
        args=_json("--args", d["args_json"], list), kwargs=_json("--kwargs", d["kwargs_json"], dict),
        misfire=Misfire(d["misfire"]) if d["misfire"] else Misfire(), overlap=d["overlap"] or "allow",
        options=options, **fields,
    )  # fmt: skip
    return spec


def _check_workers(connection: redis.Redis, queue: str) -> None:
    """Say when no RQ worker listens on ``queue``: the entry's runs would wait there unseen."""
    try:
        workers = adapter("rq.cron").workers_on(connection, queue)
    except redis.RedisError as exc:
        raise click.ClickException(f"RQ's Redis cannot be reached ({exc}): check --rq-redis") from exc
    if not workers:
        click.echo(
            f"note: no RQ worker listens on queue {queue!r} now; the entry's runs wait there until one does "
            "(and a forwarder with --rq-redis fires it)",
            err=True,
        )


def _spec(app: Any, d: dict[str, Any], store: DelayStore, run_options: RunOptions) -> ops.EntrySpec:
    """An entry from the definition options, built by the Celery adapter with ``app``'s routing."""
    options: dict[str, Any] = run_options.celery()
    for key, flag in (("queue", "queue"), ("delayq_misfire", "misfire"), ("delayq_overlap", "overlap")):
        if d[flag] is not None:
            options[key] = d[flag]
    for key, flag in (("delayq_start", "start"), ("delayq_end", "end")):
        ms = _time(f"--{flag}", d[flag])
        if ms is not None:
            options[key] = ms / 1000
    if d["max_runs"] is not None:
        options["delayq_max_runs"] = d["max_runs"]
    if d["jitter"]:
        options["delayq_jitter"] = d["jitter"]
    if d["paused"]:
        options["delayq_enabled"] = False
    conf = {
        "task": d["task"],
        "schedule": _schedule(d, lambda: str(adapter("celery.periodic").zone_of(app)), store),
        "args": _json("--args", d["args_json"], list),
        "kwargs": _json("--kwargs", d["kwargs_json"], dict),
        "options": options,
    }
    spec: ops.EntrySpec = adapter("celery.periodic").entry_spec(app, d["name"], conf)
    return spec


_DEFINITION_KEYS = (
    "name", "kind", "task", "func", "every", "aligned", "cron", "at", "args_json", "kwargs_json", "queue", "tz",
    "start", "end", "max_runs", "jitter", "misfire", "overlap", "paused", *(f.name for f in OPTION_FIELDS),
)  # fmt: skip


def _split(kw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A command's keyword arguments: (the definition's, the group's own)."""
    d = {k: kw.pop(k) for k in _DEFINITION_KEYS}
    return d, kw


# -- the commands ------------------------------------------------------------------------------------


def periodic_commands(group: click.Group, access: PeriodicAccess) -> click.Group:
    """Add the periodic commands to ``group``: list, show, history, add, update, pause, resume,
    run, backfill, remove, trust, import."""
    with_store = access.options

    @group.command("list")
    @json_option
    @with_store
    @click.pass_context
    def list_(ctx: click.Context, /, as_json: bool, **where: Any) -> None:
        """Every periodic entry: schedule, misfire policy, last run, next run, state."""
        show_periodic(access.store(ctx, where), as_json)

    @group.command("show")
    @click.argument("name")
    @json_option
    @with_store
    @click.pass_context
    def show(ctx: click.Context, /, name: str, as_json: bool, **where: Any) -> None:
        """One entry, every field (times UTC). Exit 1 if there is none of that name."""
        found = ops.get(access.store(ctx, where), name)
        if found is None:
            raise ops.EntryNotFound(name)
        _show(found, as_json)

    @group.command("history")
    @click.argument("name")
    @json_option
    @limit_option
    @with_store
    @click.pass_context
    def history(ctx: click.Context, /, name: str, as_json: bool, limit: int, **where: Any) -> None:
        """An entry's last runs (due, published, started, finished, outcome), last success, missed
        and late periods."""
        show_history(access.store(ctx, where), name, as_json, limit)

    @group.command("add")
    @_definition
    @with_store
    @click.pass_context
    def add(ctx: click.Context, /, **kw: Any) -> None:
        """Add a runtime entry NAME (it fires at every forwarder within a second; no restart).
        Exit 1 if the name exists: use update."""
        d, where = _split(kw)
        store = access.store(ctx, where)
        spec = _entry(access, ctx, where, d, store)
        if ops.get(store, spec.name) is not None:
            raise click.ClickException(f"entry {spec.name!r} exists: change it with `periodic update`")
        click.echo(f"{ops.upsert(store, spec)}: {spec.name}")

    @group.command("update")
    @_definition
    @click.option("--detach", is_flag=True, help="Take over an entry from code: a runtime entry from now on.")
    @with_store
    @click.pass_context
    def update(ctx: click.Context, /, detach: bool, **kw: Any) -> None:
        """Redefine entry NAME (its run history, pause and next period, if the schedule is the same,
        are kept). An entry from code is refused without --detach."""
        d, where = _split(kw)
        store = access.store(ctx, where)
        spec = _entry(access, ctx, where, d, store)
        if ops.get(store, spec.name) is None:
            raise ops.EntryNotFound(spec.name)
        click.echo(f"{ops.upsert(store, spec, detach=detach)}: {spec.name}")

    def action(name: str, verb: Callable[[DelayStore, str], ops.EntryStatus], doc: str) -> None:
        @group.command(name, help=doc)
        @click.argument("entry")
        @with_store
        @click.pass_context
        def command(ctx: click.Context, /, entry: str, **where: Any) -> None:
            status = verb(access.store(ctx, where), entry)
            click.echo(f"{name}: {entry} ({_state(status)}; next run {iso(status.next_run_ms) or '-'})")

    action("pause", ops.pause, "Pause entry ENTRY: no run until resumed (its manual runs still go).")
    action("resume", ops.resume, "Resume entry ENTRY; periods missed while paused follow its misfire policy.")
    action("run", ops.run_now, "Run entry ENTRY once now, besides its schedule (which stays as it is).")

    @group.command("backfill")
    @click.argument("entry")
    @click.option("--from", "start", required=True, help="First time (ISO 8601 with its offset).")
    @click.option("--to", "end", required=True, help="Last time (ISO 8601 with its offset).")
    @with_store
    @click.pass_context
    def backfill(ctx: click.Context, /, entry: str, start: str, end: str, **where: Any) -> None:
        """Run every period of entry ENTRY's schedule between --from and --to (at most 10,000)."""
        start_ms, end_ms = _time("--from", start), _time("--to", end)
        assert start_ms is not None and end_ms is not None
        status = ops.backfill(access.store(ctx, where), entry, start_ms, end_ms)
        click.echo(f"backfill: {entry} ({_state(status)})")

    @group.command("remove")
    @click.argument("names", nargs=-1, required=True)
    @click.option("--force", is_flag=True, help="Remove entries from code too (a sync adds them back).")
    @with_store
    @click.pass_context
    def remove(ctx: click.Context, /, names: tuple[str, ...], force: bool, **where: Any) -> None:
        """Remove entries by name. Entries from code are refused without --force: remove them
        from the code, or pause them."""
        removed = ops.remove(access.store(ctx, where), names, force=force)
        for name in names:
            click.echo(f"{'removed' if name in removed else 'not found'}: {name}")

    @group.command("trust")
    @click.argument("names", nargs=-1)
    @click.option("--all", "every", is_flag=True, help="Every stored entry whose kind carries code to run.")
    @with_store
    @click.pass_context
    def trust(ctx: click.Context, /, names: tuple[str, ...], every: bool, **where: Any) -> None:
        """Vouch for the stored job templates of RQ entries NAMES (or --all), as if you had added
        them: forwarders fire an RQ entry only as an operator defined it. For entries stored before
        that check, or a dead-lettered one you recognise (then `delayq dlq requeue`). Review them
        first (`delayq periodic show NAME`): a producer credential can store any template."""
        if not names and not every:
            raise click.UsageError("name the entries to trust, or pass --all")
        store = access.store(ctx, where)
        for name, outcome in ops.trust_stored(store, None if every else names).items():
            click.echo(f"{name}: {outcome}")

    import_command(group, access)
    return group


@click.group("periodic")
def periodic() -> None:
    """Periodic entries (from code and added at runtime), fired by the forwarders."""


periodic_commands(periodic, PLAIN)
