"""Server administration: ``delayq acl`` (least-privilege users per role) and ``delayq functions``
(the scripts as a Function library)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import click
from redis.cluster import RedisCluster

from ..acl import ROLES, acl_setuser
from ..connection import connect, redact_url
from ..scripts import LIBRARY, NodeFunctions, functions_status, install_functions
from .options import closing, read_secret, url_option

__all__ = ["acl", "functions_group"]


@click.command()
@click.argument("role", type=click.Choice(sorted(ROLES)))
@click.option("--prefix", envvar="DELAYQ_PREFIX", show_envvar=True, default="delayq", show_default=True)
@click.option("--user", default=None, help="User name. [default: delayq-ROLE]")
@click.option(
    "--functions/--eval",
    default=True,
    show_default=True,
    help="Let the role run the scripts only as the installed Function library (FCALL; run `delayq functions "
    "install` first), or (--eval, for Redis < 7) as EVAL scripts, which also lets it run any Lua of its own.",
)
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="PATH",
    help="The user's password, read from this file. [default: a <password> placeholder; --apply asks for it]",
)
@click.option(
    "--apply",
    is_flag=True,
    help="Run ACL SETUSER over --url/--url-file (an admin's; every node of a cluster) instead of printing it.",
)
@url_option
def acl(
    role: str, prefix: str, user: str | None, functions: bool, password_file: Path | None, apply: bool, url: str
) -> None:
    """Print (or --apply) the least-privilege ACL SETUSER command for a ROLE on a prefix.

    producer: schedule, reschedule, cancel. worker: a producer that records its runs' starts.
    forwarder: claim, ack, release, fail, wake-ups, syncs from code. operator: `delayq periodic`,
    `rq-cron sync`, `dlq`, the dashboard (the one role beside the forwarder that may define an RQ
    periodic entry, code an RQ worker runs). reader: stats, list, dead-letter list. The printed
    arguments are quoted for a POSIX shell: put `redis-cli -h HOST -p PORT` (and the admin's
    credentials) in front. Keys of the targets (RQ queues, lists) are not included: grant those
    separately.
    """
    name = user or f"delayq-{role}"
    password = read_secret(password_file, "--password-file") if password_file else None
    if apply and password is None:
        password = click.prompt(f"password of {name}", hide_input=True, confirmation_prompt=True)
    command = acl_setuser(name, prefix, role, password=password, functions=functions)
    if not apply:
        if functions and role != "reader":
            click.echo("# FCALL only: run `delayq functions install --url <admin URL>` on this server first", err=True)
        click.echo(" ".join(shlex.quote(arg) for arg in command))
        return
    client = closing(connect(url))
    if isinstance(client, RedisCluster):  # users live in each node, replicas included
        client.execute_command(*command, target_nodes=RedisCluster.ALL_NODES)
    else:
        client.execute_command(*command)
    click.echo(f"user {name!r} ({role} on prefix {prefix!r}) set on {redact_url(url)}")
    if functions and role != "reader" and not all(node.current for node in functions_status(client)):
        click.echo(f"warning: {LIBRARY} is not installed everywhere: run `delayq functions install`", err=True)


@click.group("functions")
def functions_group() -> None:
    """The scripts as a Redis/Valkey 7+ Function library, so roles need FCALL only (no EVAL).

    Until the library is installed, stores run the scripts with EVALSHA/EVAL, which FCALL-only
    users may not send.
    """


@functions_group.command("install")
@url_option
def functions_install(url: str) -> None:
    """Load this version's library on the server (on every primary of a cluster); needs an admin URL.

    Libraries of other delayq versions stay, for clients still running them: a rolling upgrade
    installs the new one first.
    """
    client = closing(connect(url))
    _print_functions(install_functions(client), "installed")


@functions_group.command("status")
@url_option
def functions_status_command(url: str) -> None:
    """Show the delayq libraries on each server. Exit code 1 if this version's is missing anywhere."""
    client = closing(connect(url))
    nodes = functions_status(client)
    _print_functions(nodes, "found")
    if not all(node.current for node in nodes):
        raise click.exceptions.Exit(1)


def _print_functions(nodes: Sequence[NodeFunctions], verb: str) -> None:
    for node in nodes:
        others = [lib for lib in node.libraries if lib != LIBRARY]
        state = f"{LIBRARY} {verb}" if node.current else f"{LIBRARY} MISSING (run `delayq functions install`)"
        click.echo(f"{node.node}: {state}" + (f"; other versions: {', '.join(others)}" if others else ""))
