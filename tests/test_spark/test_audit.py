"""The audit pipeline finds each planted anomaly (and nothing on a clean log), measures lateness,
and writes a report people can read: a PNG with the expected axes and a Markdown summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image
from pyspark.sql import SparkSession

from delayq_backends.audit import AuditRecord, JsonLinesAudit
from delayq_backends.cli import main
from delayq_backends.spark.audit import audit, records_frame
from delayq_backends.spark.report import X_LABEL, Y_LABEL, lateness_figure, write_report
from delayq_backends.targets import RedisListTarget
from tests.harness import make_store

pytestmark = pytest.mark.spark

T0 = 1_763_805_600_000  # 2025-11-22T10:00:00Z
N = 200
AS_OF = T0 + 3 * 3_600_000


def ready(k: int) -> int:
    """Items spread over two hours, so lateness has two hourly buckets."""
    return T0 + k * 36_000


def clean_log() -> tuple[list[AuditRecord], list[AuditRecord], list[AuditRecord]]:
    """Scheduled, forwarded k % 10 ms late, and executed 20 + k % 10 ms late (RQ jobs carry no ready time)."""
    scheduled = [AuditRecord("scheduled", f"j{k}", "celery", "q", ready(k), T0 - 1, 0, "snapshot") for k in range(N)]
    forwarded = [
        AuditRecord("forwarded", f"j{k}", "celery", "q", ready(k), ready(k) + k % 10, 1, "f1") for k in range(N)
    ]
    executed = [
        AuditRecord("executed", f"j{k}", "celery", "q", None if k % 2 else ready(k), ready(k) + 20 + k % 10, 0, "w1")
        for k in range(N)
    ]
    return scheduled, forwarded, executed


def test_a_clean_log_has_no_anomalies_and_its_lateness(spark: SparkSession) -> None:
    scheduled, forwarded, executed = (records_frame(spark, r) for r in clean_log())
    result = audit(spark, scheduled=scheduled, forwarded=forwarded, executed=executed, as_of_ms=AS_OF)
    assert result.anomaly_counts() == dict.fromkeys(result.ANOMALIES, 0)
    overall = {r["stage"]: r.asDict() for r in result.overall.collect()}
    assert overall["forwarding"]["count"] == overall["execution"]["count"] == N
    assert (overall["forwarding"]["max_ms"], overall["execution"]["max_ms"]) == (9, 29)
    assert 4 <= overall["forwarding"]["p50_ms"] <= 5 and overall["forwarding"]["p99_ms"] == 9
    hours = {(r["stage"], r["hour"].hour) for r in result.lateness.collect()}
    assert hours == {(s, h) for s in ("forwarding", "execution") for h in (10, 11)}


def test_planted_anomalies_are_each_found(spark: SparkSession) -> None:
    scheduled, forwarded, executed = clean_log()
    fwd = {f.id: f for f in forwarded}
    exe = {e.id: e for e in executed}
    del fwd["j3"], exe["j3"]  # never forwarded
    fwd["j7"] = AuditRecord("forwarded", "j7", "celery", "q", ready(7), ready(7) + 600_000, 1, "f1")  # late
    exe["j8"] = AuditRecord("executed", "j8", "celery", "q", ready(8), ready(8) - 250, 0, "w1")  # early
    forwarded = [*fwd.values(), AuditRecord("forwarded", "j5", "celery", "q", ready(5), ready(5) + 30_000, 2, "f2")]
    executed = [
        *exe.values(),
        AuditRecord("executed", "j9", "celery", "q", None, ready(9) + 40, 0, "w2"),  # run twice
        AuditRecord("executed", "j10", "celery", "q", ready(10), ready(10) + 5_000, 1, "w1"),  # a retry: fine
    ]
    # due after as_of - grace: not yet missing
    scheduled.append(AuditRecord("scheduled", "soon", "celery", "q", AS_OF - 1_000, T0, 0, "snapshot"))
    frames = {name: records_frame(spark, r) for name, r in zip(("s", "f", "e"), (scheduled, forwarded, executed))}
    result = audit(spark, scheduled=frames["s"], forwarded=frames["f"], executed=frames["e"], as_of_ms=AS_OF)

    def ids(name: str) -> list[str]:
        return sorted(r["id"] for r in getattr(result, name).collect())

    assert ids("never_forwarded") == ["j3"]
    assert ids("duplicate_forwards") == ["j5"]
    assert ids("late_forwards") == ["j7"]
    assert ids("early_executions") == ["j8"]
    assert ids("duplicate_executions") == ["j9"]
    (early,) = result.early_executions.collect()
    assert early["early_ms"] == 250
    (twice,) = result.duplicate_forwards.collect()
    assert (twice["times"], sorted(twice["by"])) == (2, ["f1", "f2"])


def test_report_png_and_markdown(spark: SparkSession, tmp_path: Path) -> None:
    scheduled, forwarded, executed = (records_frame(spark, r) for r in clean_log())
    result = audit(spark, scheduled=scheduled, forwarded=forwarded, executed=executed, as_of_ms=AS_OF)
    rows = [r.asDict() for r in result.lateness.collect()]
    figure = lateness_figure(rows)
    (ax,) = figure.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == (X_LABEL, Y_LABEL)
    assert len(ax.get_lines()) == 4, "p50 and p99 of forwarding and execution"
    p99 = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}["forwarding q p99"]
    assert p99 == [9, 9]

    paths = write_report(result, tmp_path / "out")
    with Image.open(paths["png"]) as image:
        assert (image.format, image.size) == ("PNG", (1000, 500))
        assert len(image.convert("L").getcolors(maxcolors=256) or []) > 10, "something is drawn"
    markdown = paths["markdown"].read_text()
    assert "| forwarding | 200 |" in markdown and "No anomalies." in markdown
    assert "![lateness by hour](lateness.png)" in markdown
    assert spark.read.parquet(str(paths["lateness"])).count() == 4
    assert json.loads(paths["summary"].read_text())["anomalies"] == dict.fromkeys(result.ANOMALIES, 0)


def test_cli_exports_a_snapshot_and_audits_files(
    spark: SparkSession, valkey_url: str, prefix: str, tmp_path: Path
) -> None:
    store = make_store(valkey_url, prefix, shards=4)
    store.schedule_many((f"c{k}", ready(k) / 1000, RedisListTarget.envelope("L", b"x")) for k in range(N))
    runner = CliRunner()
    store_args = ["--url", valkey_url, "--prefix", prefix, "--shards", "4"]
    snapshot = tmp_path / "scheduled.jsonl"
    exported = runner.invoke(main, ["spark", "export", *store_args, "--out", str(snapshot)])
    assert exported.exit_code == 0, exported.output
    assert f"wrote {N} records" in exported.output
    assert {json.loads(line)["id"] for line in snapshot.read_text().splitlines()} == {f"c{k}" for k in range(N)}

    log = JsonLinesAudit(tmp_path / "fwd", stem="forwarded", background=False)
    log.record([AuditRecord("forwarded", f"c{k}", "list", "L", ready(k), ready(k) + 3, 1, "f") for k in range(1, N)])
    log.close()
    out = tmp_path / "report"
    args = ["spark", "audit", "--scheduled", str(snapshot), "--forwarded", str(tmp_path / "fwd"), "--out", str(out)]
    audited = runner.invoke(main, [*args, "--as-of", "2025-11-22T14:00:00+00:00"])
    assert audited.exit_code == 0, audited.output
    assert "never_forwarded: 1" in audited.output and "duplicate_forwards: 0" in audited.output
    assert (out / "lateness.png").exists() and "c0" in (out / "report.md").read_text()
