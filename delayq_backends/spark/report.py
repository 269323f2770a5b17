"""Write an audit out: Parquet tables for machines, a PNG chart and a Markdown summary for people."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..errors import MissingExtraError

try:
    import matplotlib
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(f"the audit report needs matplotlib ({exc})", "spark") from exc

matplotlib.use("Agg")  # no display: reports are written on servers and in CI

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from .audit import QUANTILES, AuditResult  # noqa: E402

__all__ = ["X_LABEL", "Y_LABEL", "lateness_figure", "write_report"]

X_LABEL = "ready time (hour, UTC)"
Y_LABEL = "lateness (ms)"
#: Rows of each anomaly listed in the Markdown summary (the Parquet tables hold them all).
SAMPLE_ROWS = 10


def lateness_figure(lateness: list[dict[str, Any]]) -> Figure:
    """p50 and p99 lateness per hour, one pair of lines per stage and queue.

    Args:
        lateness: rows of :attr:`AuditResult.lateness` (stage, queue, hour, p50_ms, p99_ms, ...),
            ``hour`` as a datetime (aware: UTC).
    """
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in sorted(lateness, key=lambda r: r["hour"]):
        series.setdefault((row["stage"], row["queue"]), []).append(row)
    for (stage, queue), rows in sorted(series.items()):
        hours = [r["hour"] for r in rows]
        line = ax.plot(hours, [r["p50_ms"] for r in rows], marker="o", label=f"{stage} {queue} p50")[0]
        ax.plot(
            hours,
            [r["p99_ms"] for r in rows],
            marker="^",
            linestyle="--",
            color=line.get_color(),
            label=f"{stage} {queue} p99",
        )
    hours = sorted({row["hour"] for row in lateness})
    if hours:  # a margin of half an hour, so one hour of data is not lost on an axis of years
        ax.set_xlim(hours[0] - timedelta(minutes=30), hours[-1] + timedelta(minutes=30))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d %H:%M", tz=timezone.utc))
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABEL)
    ax.set_title("delayq: lateness after the ready time")
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def write_report(result: AuditResult, out: str | Path) -> dict[str, Path]:
    """Write every table as Parquet, ``lateness.png``, ``report.md`` and ``summary.json`` under ``out``.

    Returns the paths written, by name.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, table in result.tables().items():
        table.write.mode("overwrite").parquet(str(out / name))
        paths[name] = out / name
    # hours as aware UTC datetimes: collect() would give naive ones in this machine's zone
    hour_ms = result.lateness.withColumn("hour", F.unix_millis("hour")).collect()
    lateness = [{**row.asDict(), "hour": datetime.fromtimestamp(row["hour"] / 1000, timezone.utc)} for row in hour_ms]
    figure = lateness_figure(lateness)
    paths["png"] = out / "lateness.png"
    figure.savefig(paths["png"])
    plt.close(figure)
    counts = result.anomaly_counts()
    overall = [row.asDict() for row in result.overall.collect()]
    paths["summary"] = out / "summary.json"
    paths["summary"].write_text(
        json.dumps({"as_of_ms": result.as_of_ms, "anomalies": counts, "overall": overall}, indent=2)
    )
    paths["markdown"] = out / "report.md"
    paths["markdown"].write_text(_markdown(result, counts, overall))
    return paths


def _markdown(result: AuditResult, counts: dict[str, int], overall: list[dict[str, Any]]) -> str:
    as_of = datetime.fromtimestamp(result.as_of_ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")
    lines = [f"# delayq audit as of {as_of}", "", "## Lateness", ""]
    lines += [
        "| stage | count | " + " | ".join(QUANTILES) + " | max_ms |",
        "|---|---:|" + "---:|" * (len(QUANTILES) + 1),
    ]
    lines += [
        f"| {r['stage']} | {r['count']} | " + " | ".join(str(r[q]) for q in QUANTILES) + f" | {r['max_ms']} |"
        for r in overall
    ]
    lines += ["", "![lateness by hour](lateness.png)", "", "## Anomalies", ""]
    lines += ["| check | count |", "|---|---:|"] + [f"| {name} | {n} |" for name, n in counts.items()]
    for name, n in counts.items():
        if n:
            rows = [r.asDict() for r in getattr(result, name).limit(SAMPLE_ROWS).collect()]
            lines += ["", f"### {name} (first {min(n, SAMPLE_ROWS)} of {n})", ""]
            lines += ["```", *(json.dumps(r, default=str) for r in rows), "```"]
    verdict = "No anomalies." if not any(counts.values()) else f"{sum(counts.values())} anomalies: see above."
    return "\n".join([*lines, "", verdict, ""])
