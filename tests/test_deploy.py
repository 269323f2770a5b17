"""The shipped Prometheus alert rules and Grafana dashboard (deploy/): valid YAML and JSON, and
every metric their expressions name is served by a live ``delayq exporter`` (the periodic
entries' gauges, from an entry with history) or a live ``delayq forward --metrics-port`` (the
forwarding counters and lateness histogram, which only forwarders count)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery

from delayq_backends.celery.periodic import sync
from delayq_backends.embedded import free_port
from delayq_backends.periodic.history import RunMark, record_finished, record_published
from delayq_backends.targets import RedisListTarget
from tests.harness import ROOT, Launcher, make_store
from tests.test_metrics import listening, scraped_forwarder

ALERTS = ROOT / "deploy" / "prometheus" / "delayq-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "delayq.json"
METRIC = re.compile(r"\bdelayq_[a-z0-9_]+")


def strings(node: Any) -> Iterator[str]:
    """Every string value under the JSON/YAML ``node`` whose key names a query."""
    if isinstance(node, dict):
        for key, child in node.items():
            if key in ("expr", "query", "definition") and isinstance(child, str):
                yield child
            else:
                yield from strings(child)
    elif isinstance(node, list):
        for child in node:
            yield from strings(child)


def test_the_alert_rules_are_prometheus_rule_groups() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert {"DelayqPeriodicMissedPeriod", "DelayqPeriodicNoSuccess", "DelayqForwardersDown"} <= alerts.keys()
    assert "3 * delayq_periodic_period_seconds" in alerts["DelayqPeriodicNoSuccess"]["expr"]  # N, as documented
    assert all(r["expr"].strip() and r["labels"]["severity"] for r in alerts.values())


def test_the_dashboard_is_grafana_json_with_the_panels_named() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for word in ("forward rate", "lateness", "dead letters", "slots", "periodic entries"):
        assert word in titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(t["refId"] for p in dashboard["panels"] for t in p["targets"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_checks_the_rules() -> None:
    subprocess.run(["promtool", "check", "rules", str(ALERTS)], check=True, timeout=60)


def test_every_metric_queried_is_served(valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path) -> None:
    store = make_store(valkey_url, prefix, shards=4)
    app = Celery("deploy", broker="memory://")
    app.conf.beat_schedule = {"hourly": {"task": "t.hourly", "schedule": timedelta(hours=1)}}
    assert sync(app, store).added == ["hourly"]
    mark = RunMark("hourly", store.clock() - 3_600_000)
    record_published(store, mark, "r1", missed=1)
    record_finished(store, mark, "r1", "success")
    store.schedule("now", 0, RedisListTarget.envelope(f"{prefix}:out", b"x"))
    store.set_group("tenant-7", limit=2)  # the group gauges have a series only for a group in use
    common = ["--url", valkey_url, "--prefix", prefix, "--shards", "4"]
    served = {s.name for s in scraped_forwarder(procs, [*common, "--log-level", "error"], 1, 0, 20)}
    port = free_port()
    served |= {s.name for s in listening(procs.delayq("exporter", *common, "--port", str(port)), port)}
    assert "delayq_periodic_last_success_timestamp_seconds" in served
    for path in (ALERTS, DASHBOARD):
        doc = yaml.safe_load(path.read_text()) if path.suffix == ".yml" else json.loads(path.read_text())
        queried = {name for text in strings(doc) for name in METRIC.findall(text)}
        assert queried, path
        assert queried - served == set(), f"{path.name} queries metrics no exporter or forwarder serves"
