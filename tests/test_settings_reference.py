"""docs/configuration.md's settings reference is generated from the records' own tables (each
field's :class:`~delayq_backends.config.Setting`): it fails when the page and the tables differ,
when a field of a settings record has no setting, or when a flag or Celery setting has no row.
``DELAYQ_WRITE_DOCS=1`` rewrites the page's reference instead."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

import click
from click.testing import CliRunner

from delayq_backends.assemble import ProcessSettings
from delayq_backends.celery.settings import KNOWN, LAZY_FUNCTIONS, SCHEDULE_VERSION, CelerySettings
from delayq_backends.cli.celery import forward as celery_forward
from delayq_backends.cli.forward import ForwardOptions, forward, forward_options
from delayq_backends.config import Config, reference, settings_of
from delayq_backends.flow import FlowControl
from delayq_backends.forwarder.settings import LOSSLESS, ForwarderSettings

PAGE = Path(__file__).parent.parent / "docs" / "configuration.md"
BEGIN, END = (
    "<!-- settings reference: generated from the records, see tests/test_settings_reference.py -->",
    "<!-- end -->",
)
TABLES = (
    ("The store: `Config`", settings_of(Config)),
    ("The forwarder: `ForwarderSettings`", (*settings_of(ForwarderSettings), LOSSLESS)),
    ("Flow control: `FlowControl` (the forwarder's `flow`)", settings_of(FlowControl)),
    ("A forwarder process: `ProcessSettings` (`delayq forward`)", settings_of(ProcessSettings)),
    ("Celery only: `CelerySettings`", (*settings_of(CelerySettings), LAZY_FUNCTIONS, SCHEDULE_VERSION)),
)
#: fields that hold a nested record, not a setting
NESTED = {"store", "forwarder", "config", "flow"}


def test_the_reference_is_the_one_the_tables_generate() -> None:
    text = PAGE.read_text()
    head, _, rest = text.partition(BEGIN + "\n")
    _, _, tail = rest.partition("\n" + END)
    expected = reference(TABLES)
    if os.environ.get("DELAYQ_WRITE_DOCS"):
        PAGE.write_text(f"{head}{BEGIN}\n{expected}\n{END}{tail}")
    assert rest.partition("\n" + END)[0] == expected, "run DELAYQ_WRITE_DOCS=1 pytest tests/test_settings_reference.py"


def test_every_field_of_a_settings_record_is_a_setting() -> None:
    for record in (Config, ForwarderSettings, ProcessSettings, CelerySettings):
        named = {s.name for s in settings_of(record)}
        assert {f.name for f in fields(record)} - NESTED == named, record


def test_every_flag_and_celery_setting_has_a_row() -> None:
    rows = {s.flag for _, table in TABLES for s in table} | {a for _, table in TABLES for s in table for a in s.aliases}
    # the address's file forms and the command's own, which configure no record
    own = {"--url-file", "--list-redis-file", "--celery-broker-file", "--rq-redis-file", "--rq-cron", "--periodic-sync"}
    for command in (forward, celery_forward):
        for param in command.params:
            if isinstance(param, click.Option):
                flags = {f for f in param.opts if not param.hidden or f in rows}
                assert flags & (rows | own), f"{param.opts}: no row in docs/configuration.md"
    assert {s.celery for _, table in TABLES for s in table if s.celery} == KNOWN


def test_the_old_flags_still_work_hidden() -> None:
    """``--batch`` and ``--overlap`` became ``--claim-size`` and ``--claim-ahead``: both names set
    the same setting, and only the new one shows in ``--help``."""
    seen: list[ForwardOptions] = []
    command = click.command()(forward_options(lambda run: seen.append(run)))
    for args in (["--batch", "7", "--overlap"], ["--claim-size", "7", "--claim-ahead"]):
        assert CliRunner().invoke(command, args).exit_code == 0
        settings = seen.pop().settings(ProcessSettings(Config())).forwarder
        assert (settings.batch, settings.overlap) == (7, True)
    shown = CliRunner().invoke(command, ["--help"]).output
    assert "--claim-size" in shown and "--claim-ahead" in shown
    assert "--batch" not in shown and "--overlap" not in shown
