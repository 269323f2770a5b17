"""Options shared by the ``delayq`` commands (and ``celery -A proj delayq``): where the store
is, secrets kept out of ``ps``, paging, times, and errors turned into one clean line."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click
import redis
from click.core import ParameterSource

from ..config import DEFAULT_URL, Config, settings_of
from ..errors import DelayqError, InvalidTimeError
from ..store import DelayStore
from ..storespec import StoreSpec
from ..timeutil import When, parse_iso, to_ms

__all__ = [
    "PeriodicAccess",
    "ErrorsAsMessages",
    "celery_broker_option",
    "check_shard",
    "closing",
    "configure_logging",
    "json_option",
    "open_store",
    "page_options",
    "read_secret",
    "rq_redis_option",
    "secret_option",
    "shard_option",
    "store_options",
    "url_option",
    "when_option",
]


def secret_option(
    name: str,
    *,
    envvar: str,
    help: str,
    default: str | None = None,
    required: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--NAME URL`` (env ENVVAR) and ``--NAME-file PATH`` (env ENVVAR_FILE), reaching the command
    as one argument ``NAME``.

    The file form keeps a password out of ``ps`` and the shell history (a command line is
    readable by every user of the host); it wins over the env var, and giving both forms on the
    command line is refused.
    """
    param = name.replace("-", "_")
    file_param = f"{param}_file"

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def with_secret(*args: Any, **kwargs: Any) -> Any:
            value, path = kwargs.pop(param), kwargs.pop(file_param)
            if path is not None:
                if click.get_current_context().get_parameter_source(param) == ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"pass --{name} or --{name}-file, not both")
                value = read_secret(path, f"--{name}-file")
            if required and value is None:
                raise click.UsageError(f"pass --{name}, {envvar} or --{name}-file")
            return command(*args, **{param: value}, **kwargs)

        file_help = f"Read the --{name} value from this file (keeps a password out of `ps`)."
        with_secret = click.option(
            f"--{name}-file",
            file_param,
            envvar=f"{envvar}_FILE",
            show_envvar=True,
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            metavar="PATH",
            help=file_help,
        )(with_secret)
        return click.option(
            f"--{name}",
            param,
            envvar=envvar,
            show_envvar=True,
            default=default,
            show_default=default is not None,
            metavar="URL",
            help=help + " A password in it shows in `ps`: prefer the env var or the -file option.",
        )(with_secret)

    return decorate


def read_secret(path: Path, option: str) -> str:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint=option) from exc
    if not value:
        raise click.BadParameter(f"{path} is empty", param_hint=option)
    return value


_ADDRESS = {s.name: s for s in settings_of(Config)}
url_option = secret_option("url", envvar=_ADDRESS["url"].envvar or "", default=DEFAULT_URL, help=_ADDRESS["url"].help)


def store_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add ``--url``/``--url-file``/``--prefix``/``--shards`` (from :class:`Config`'s settings) and
    pass them as ``spec``."""

    @functools.wraps(command)
    def with_spec(*args: Any, url: str, prefix: str, shards: int, **kwargs: Any) -> None:
        command(*args, spec=StoreSpec(url, prefix, shards), **kwargs)

    for s in (_ADDRESS["shards"], _ADDRESS["prefix"]):
        with_spec = click.option(
            s.flag or "", envvar=s.envvar, show_envvar=True, type=type(s.default), default=s.default,
            show_default=True, help=s.help,
        )(with_spec)  # fmt: skip
    return url_option(with_spec)


class ErrorsAsMessages(click.Group):
    """A group that turns delayq and Redis errors into one clean ``Error:`` line (exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DelayqError as exc:
            raise click.ClickException(str(exc)) from exc
        except redis.RedisError as exc:
            raise click.ClickException(f"Redis error: {exc}") from exc


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (for scripts).")
shard_option = click.option("--shard", type=int, default=None, help="Only this shard.")


def page_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add ``--offset`` and ``--limit``: listings are paged so a huge store never floods a terminal."""
    command = click.option(
        "--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="Rows per page."
    )(command)
    return click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="Rows to skip.")(
        command
    )


def when_option(value: str | None, option: str) -> When | None:
    """Read ``--from``/``--to``: ISO-8601 with a zone, or epoch seconds. A time without a zone is
    refused, because the store cannot guess which zone was meant."""
    if value is None:
        return None
    text = value.strip()
    try:
        when: When = float(text)
    except ValueError:
        when = _iso(text, option)
    try:
        to_ms(when)
    except InvalidTimeError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc
    return when


def _iso(text: str, option: str) -> When:
    try:
        return parse_iso(text)
    except InvalidTimeError as exc:
        raise click.BadParameter(f"{exc}, or epoch seconds", param_hint=option) from exc


def check_shard(spec: StoreSpec, shard: int | None) -> None:
    """Refuse a ``--shard`` outside the layout with a usage error instead of a traceback."""
    if shard is not None and not 0 <= shard < spec.shards:
        raise click.BadParameter(f"shard {shard} does not exist: use 0..{spec.shards - 1}", param_hint="--shard")


def open_store(spec: StoreSpec, *, writes: bool, socket_timeout: float | None = None) -> DelayStore:
    """:meth:`StoreSpec.open`, its client closed when the command ends."""
    store = spec.open(writes=writes, socket_timeout=socket_timeout)
    closing(store.client)
    return store


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


def closing(client: C) -> C:
    """``client``, closed when the command ends."""
    click.get_current_context().call_on_close(client.close)
    return client


def celery_broker_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--celery-broker URL`` (env ``DELAYQ_CELERY_BROKER``) or ``--celery-broker-file``, for each
    command that reaches Celery's broker."""
    return secret_option("celery-broker", envvar="DELAYQ_CELERY_BROKER", help=help)


def rq_redis_option(help: str, *, required: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--rq-redis URL`` (env ``DELAYQ_RQ_REDIS``) or ``--rq-redis-file``, for each command that
    reaches RQ's Redis."""
    return secret_option("rq-redis", envvar="DELAYQ_RQ_REDIS", help=help, required=required)


def configure_logging(level: str) -> None:
    """Log to stderr; only delayq's own loggers follow ``level``, so redis-py's debug chatter stays out.

    Only the CLI configures logging: a library leaves that to the application.
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("delayq").setLevel(level.upper())


@dataclass(frozen=True)
class PeriodicAccess:
    """How a group's commands reach their store and a Celery app to build entries with.

    ``options`` adds the group's own options to each command (the store options for ``delayq``);
    ``store``, ``app`` and ``rq`` read them back from the command's keyword arguments. ``rq``
    opens RQ's Redis for RQ entries; None where the group adds none (``celery -A proj``).
    """

    options: Callable[[Callable[..., None]], Callable[..., None]]
    store: Callable[[click.Context, dict[str, Any]], DelayStore]
    app: Callable[[click.Context, dict[str, Any]], Any]
    rq: Callable[[click.Context, dict[str, Any], DelayStore], redis.Redis] | None = None
