"""``delayq forward``: run a forwarder, built by :func:`~delayq_backends.assemble.build_forwarder`
from the options; ``celery -A proj delayq forward`` shares the options and the run."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import click

from ..assemble import DescribedTarget, ProcessSettings, build_forwarder
from ..config import Config, Setting, settings_of
from ..errors import ConfigError
from ..flow import FlowControl
from ..forwarder.settings import LOSSLESS, LOSSLESS_WINDOW, ForwarderSettings
from ..store import DelayStore
from ..storespec import StoreSpec, open_store
from .options import closing, configure_logging, secret_option, store_options
from .rq import schedule_version_option, sync_rq_cron

__all__ = ["ForwardOptions", "forward", "forward_options", "run_forwarder"]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

#: ``delayq forward``'s own settings: its targets (the Celery command's is the app's broker); the
#: URLs take a ``-file`` form too (:func:`secret_option`)
_URLS = ("list_redis", "celery_broker", "rq_redis")
_TARGETS = (*_URLS, "rq_allow_classes", "rq_class_retry", "rq_adopt")
#: The records whose flagged settings are the options shared by ``delayq forward`` and
#: ``celery -A proj delayq forward``, by the name :class:`ForwardOptions` files them under
#: (the store's address is :func:`store_options`').
_SHARED: dict[str, tuple[Setting, ...]] = {
    "store": tuple(s for s in settings_of(Config) if s.name not in ("url", "prefix", "shards")),
    "forwarder": (*settings_of(ForwarderSettings), LOSSLESS),
    "flow": settings_of(FlowControl),
    "process": tuple(s for s in settings_of(ProcessSettings) if s.name not in _TARGETS),
}


@dataclass(frozen=True)
class ForwardOptions:
    """The forwarder options given on a command line (or by their env vars), by record: ``store``
    (:class:`Config`), ``forwarder``, ``flow`` and ``process``; what was not given is absent, so
    :meth:`settings` keeps the base's value (the defaults, or a Celery app's settings)."""

    given: Mapping[str, Mapping[str, Any]]

    def settings(self, base: ProcessSettings) -> ProcessSettings:
        """``base`` with the given options on top: a value replaces the base's, except group
        policies and flow control, whose options go ahead of the base's patterns and queues."""
        forwarder = dict(self.given["forwarder"])
        lossless = forwarder.pop("lossless", None)
        window = forwarder.get("lossless_window") or (base.forwarder.lossless_window if lossless is None else None)
        on = base.forwarder.lossless_window is not None if lossless is None else lossless
        forwarder.update(
            flow=FlowControl(**self.given["flow"]), lossless_window=(window or LOSSLESS_WINDOW) if on else None
        )
        store = _over(base.store, self.given["store"])
        settings: ProcessSettings = _over(
            base, self.given["process"], store=store, forwarder=_over(base.forwarder, forwarder)
        )
        return settings


def _over(record: Any, given: Mapping[str, Any], **more: Any) -> Any:
    values = {**given, **more}
    return replace(
        record, **{k: getattr(record, k).merged(v) if hasattr(v, "merged") else v for k, v in values.items()}
    )


def _option(s: Setting, dest: str, flag: str, hidden: bool = False) -> Decorator:
    """The click option of ``s`` under ``flag``; its default None says "not given"."""
    kind = s.kind or type(s.default)
    shown = s.default_text.replace("`", "")
    kw: dict[str, Any] = {"default": None, "metavar": s.metavar, "hidden": hidden, "envvar": s.envvar}
    kw.update(show_envvar=s.envvar is not None, help=f"{s.help} [default: {shown}]")
    decls = [f"{flag}/--no-{flag[2:]}" if kind is bool else flag, dest]
    if s.specs is not None:
        kw.update(multiple=True, callback=_specs(s.specs), help=s.help)
    elif s.choices:
        kw["type"] = click.Choice(s.choices, case_sensitive=False)
    elif kind is int:
        kw["type"] = click.IntRange(_whole(s.low), _whole(s.high))
    elif kind is float:
        kw["type"] = click.FloatRange(s.low, s.high)
    return click.option(*decls, **kw)


def _whole(bound: float | None) -> int | None:
    return None if bound is None else int(bound)


def _specs(parse: Callable[[Sequence[str]], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback turning a repeatable option's texts into its value."""

    def callback(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> Any:
        try:
            return parse(values)
        except ConfigError as exc:
            raise click.BadParameter(str(exc)) from exc

    return callback


def setting_options(groups: Mapping[str, Sequence[Setting]], into: str = "given") -> Decorator:
    """Options made from the settings of ``groups`` that have a flag (each old flag as a hidden
    alias); they reach the command as one argument ``into``: group -> setting name -> value, if given."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        flagged = [(g, s, f"{g}__{s.name}") for g, settings in groups.items() for s in settings if s.flag]

        @functools.wraps(command)
        def with_given(*args: Any, **kwargs: Any) -> Any:
            given: dict[str, dict[str, Any]] = {g: {} for g in groups}
            for group, s, dest in flagged:
                values = [kwargs.pop(d) for d in (dest, *(f"{dest}__{i}" for i in range(len(s.aliases))))]
                value = next((v for v in values if v is not None), None)
                if value is not None:
                    given[group][s.name] = value
            return command(*args, **{into: given}, **kwargs)

        decorated: Callable[..., Any] = with_given
        for _, s, dest in reversed(flagged):
            for i, alias in enumerate(s.aliases):
                decorated = _option(s, f"{dest}__{i}", alias, hidden=True)(decorated)
            decorated = _option(s, dest, s.flag or "")(decorated)
        return decorated

    return decorate


def forward_options(command: Callable[..., None]) -> Callable[..., None]:
    """The run options of a forwarder, shared by ``delayq forward`` and ``celery delayq forward``.

    They reach the command as one :class:`ForwardOptions` argument, ``run``.
    """

    @setting_options(_SHARED)
    @functools.wraps(command)
    def with_run(*args: Any, given: Mapping[str, Mapping[str, Any]], **kwargs: Any) -> None:
        command(*args, run=ForwardOptions(given), **kwargs)

    return with_run


def run_forwarder(
    settings: ProcessSettings, *, store: DelayStore | None = None, targets: Sequence[DescribedTarget] = ()
) -> None:
    """Configure logging, build the forwarder, say what it forwards where, and forward until
    SIGTERM/SIGINT (then finish the batch and return)."""
    configure_logging(settings.log_level)
    with build_forwarder(settings, store=store, targets=targets) as assembled:
        click.echo(f"delayq forward: {assembled.describe()}", err=True)
        assembled.run()


def _secret_options(command: Callable[..., None]) -> Callable[..., None]:
    """The target URLs, each with its ``-file`` form (:func:`secret_option`)."""
    for s in reversed([s for s in settings_of(ProcessSettings) if s.name in _URLS]):
        shown = s.default_text.replace("`", "")
        command = secret_option((s.flag or "")[2:], envvar=s.envvar or "", help=f"{s.help} [default: {shown}]")(command)
    return command


@click.command()
@store_options
@forward_options
@_secret_options
@setting_options({"process": [s for s in settings_of(ProcessSettings) if s.name in _TARGETS[len(_URLS) :]]}, "targets")
@click.option(
    "--rq-cron",
    metavar="CONFIG",
    default=None,
    envvar="DELAYQ_RQ_CRON",
    help="An `rq cron` config (module path or .py file): sync its cron.register entries into the store at start "
    "and fire them (with --rq-redis), instead of running `rq cron`.",
)
@schedule_version_option
def forward(
    spec: StoreSpec,
    run: ForwardOptions,
    targets: Mapping[str, Mapping[str, Any]],
    rq_cron: str | None,
    schedule_version: int | None,
    **urls: Any,
) -> None:
    """Forward due items to their targets until SIGTERM/SIGINT, then finish the batch and exit 0.

    Run as many as you like, anywhere: leases make every claim exclusive.
    """
    settings = replace(run.settings(ProcessSettings(spec.config())), **urls, **targets["process"])
    store = None
    if rq_cron is not None:
        if not settings.rq_redis:
            raise click.BadParameter("RQ cron entries run on RQ's Redis: add --rq-redis URL", param_hint="--rq-cron")
        store = open_store(settings.store, writes=True)  # with the run's settings (group policies)
        closing(store.client)
        _sync_at_start(store, rq_cron, schedule_version)
    run_forwarder(settings, store=store)


def _sync_at_start(store: DelayStore, config: str, version: int | None) -> None:
    """Sync the rq cron config; a config that cannot load stops the start (ConfigError), a store
    that cannot sync does not: the entries already stored keep firing as last synced."""
    from ..rq.cron import load_config

    loaded = load_config(config)  # a config that cannot load is the operator's to fix now
    try:
        sync_rq_cron(store, loaded, version, at_start=True)
    except Exception as exc:
        click.echo(
            f"rq cron entries NOT synced ({type(exc).__name__}: {exc}); those already stored keep running as last "
            f"synced: run `delayq rq-cron sync {config}` once the store answers",
            err=True,
        )
