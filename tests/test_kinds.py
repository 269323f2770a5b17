"""The kinds of envelope target and of schedule are each one table (``delayq_backends.kinds``,
``periodic.schedules.SCHEDULE_KINDS``): every row round-trips through assemble, periodic and the
listings (or through JSON), and no module outside the table compares a target or entry kind by
its name."""

from __future__ import annotations

import ast
from pathlib import Path

from delayq_backends import Config
from delayq_backends.assemble import ProcessSettings, build_forwarder
from delayq_backends.kinds import ENTRY_KINDS, KINDS, kind_of
from delayq_backends.periodic import options
from delayq_backends.periodic.schedules import SCHEDULE_KINDS, Cron, Every, Once, schedule_from_json

PACKAGE = Path(__file__).resolve().parent.parent / "delayq_backends"
#: the names of the kinds of target and of periodic entry
NAMES = {*KINDS, *ENTRY_KINDS}


def switches(tree: ast.AST) -> list[str]:
    """Comparisons with a kind's name (``target == "rq"``, ``kind in ("celery", ...)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            values = [e for s in sides for e in (s.elts if isinstance(s, ast.Tuple | ast.List | ast.Set) else [s])]
            if any(isinstance(v, ast.Constant) and v.value in NAMES for v in values):
                found.append(ast.unparse(node))
    return found


def test_no_module_switches_on_a_kind_by_name() -> None:
    found = {
        f"{path.relative_to(PACKAGE)}: {s}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "kinds.py"
        for s in switches(ast.parse(path.read_text()))
    }
    assert not found, "read the kind's row in delayq_backends.kinds instead"


def test_the_scan_finds_a_switch() -> None:
    assert switches(ast.parse('if envelope.target == "rq" or kind in ("x", "celery-periodic"): pass'))


def test_every_kind_is_built_by_assemble(valkey_url: str, prefix: str, rabbitmq_url: str) -> None:
    """All settings on: one target of each kind in the table, each delivering its row's name."""
    settings = ProcessSettings(
        store=Config(url=valkey_url, prefix=prefix, shards=2), celery_broker=rabbitmq_url, rq_redis=valkey_url,
        rq_adopt=False,
    )  # fmt: skip
    with build_forwarder(settings) as assembled:
        assert sorted(t.target.kind for t in assembled.targets) == sorted(KINDS)
    assert all(hasattr(settings, k.setting) for k in KINDS.values() if k.targets)


def test_every_entry_kind_reads_its_templates_and_is_a_periodic_kind() -> None:
    for target, kind in KINDS.items():
        if kind.view is not None:
            assert callable(kind.view.load())
        if kind.entry is not None:
            assert kind_of(target) == (kind.entry, kind.entry.task_of.load())
            assert kind.entry.trust is None or callable(kind.entry.trust.load())
        else:
            assert kind_of(target) is None
    assert set(ENTRY_KINDS) == set(options.KINDS)


def test_every_schedule_kind_round_trips_through_json() -> None:
    examples = [Every(60_000, aligned=True), Cron("0 9 1 * 1", "Europe/Berlin", day_or=True), Once(1_700_000_000_000)]
    assert {type(e) for e in examples} == set(SCHEDULE_KINDS), "a new kind: add an example"
    assert len({k.KEY for k in SCHEDULE_KINDS}) == len(SCHEDULE_KINDS)
    for schedule in examples:
        assert schedule_from_json(schedule.to_json()) == schedule
