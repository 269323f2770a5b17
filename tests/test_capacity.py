"""The capacity model and ``delayq capacity``: each limit binds when it should, with figures
worked out by hand from round costs, and bad input is refused with the fix."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from delayq_backends.capacity import MAX_SHARDS, Costs, Limits, Workload, plan, predict_forward_rate
from delayq_backends.cli.capacity import capacity, parse_amount
from delayq_backends.errors import ConfigError

#: Round costs so the expected figures can be checked by hand.
COSTS = Costs(
    schedule_us=4,
    claim_us=10,
    ack_us=5,
    publish_us=1,
    claim_call_us=100,
    ack_call_us=100,
    forwarder_us=20,
    bytes_per_item=500,
    wire_bytes_per_item=1000,
)
LIMITS = Limits(
    master_cpu_share=0.5,
    master_memory_bytes=10e9,
    master_network_bytes_s=100e6,
    forwarder_cpu_share=0.5,
    max_block_us=5_000,
    batch=200,
    rtt_us=100,
    round_trips_per_batch=2,
    min_shards=16,
)


def test_fire_rate_binds_cpu() -> None:
    # per forwarded item on the store: 10 + 5 + (100 + 100) / 200 = 16 µs (the publish is the
    # broker's); 1M/s: 16 cores; + 10k/s · 4 µs of scheduling
    result = plan(Workload(schedule_rate=10_000, fire_rate=1_000_000, backlog=1_000_000), COSTS, LIMITS)
    assert result.masters_by["cpu"] == math.ceil((16e6 + 40_000) / 0.5e6) == 33
    assert (result.masters, result.binding) == (33, "cpu")
    assert result.shards == 33 and result.shards % result.masters == 0
    # one forwarder waits for store and broker: 1e6 / (20 + 16 + 1 + 2 · 100 / 200) = 26,315/s
    assert result.forwarder_rate == pytest.approx(1e6 / 38)
    assert result.forwarders == math.ceil(1_000_000 / (1e6 / 38 * 0.5)) == 76
    assert result.cpu_per_master == pytest.approx(16.04 / 33)


def test_backlog_binds_memory() -> None:
    result = plan(Workload(schedule_rate=1_000, fire_rate=1_000, backlog=1e9), COSTS, LIMITS)
    assert result.masters_by["memory"] == 50  # 500 GB over 10 GB masters
    assert (result.masters, result.binding) == (50, "memory")
    assert result.memory_per_master == pytest.approx(10e9)
    assert result.shards == 50  # a multiple of the masters, at least 16


def test_big_items_bind_network() -> None:
    costs = replace(COSTS, wire_bytes_per_item=100_000)
    result = plan(Workload(schedule_rate=1_000, fire_rate=1_000, backlog=1_000), costs, LIMITS)
    assert result.masters_by == {"cpu": 1, "memory": 1, "network": 2}  # 200 MB/s over 100 MB/s NICs
    assert result.binding == "network"


def test_a_small_workload_needs_one_master_and_the_minimum_shards() -> None:
    result = plan(Workload(schedule_rate=100, fire_rate=100, backlog=10_000), COSTS, LIMITS)
    assert (result.masters, result.shards, result.forwarders, result.binding) == (1, 16, 1, "none")
    assert result.notes == []


def test_shards_spread_evenly_over_the_masters() -> None:
    for backlog in (25e9, 31e9, 55e9, 101e9):  # 3, 4, 6, 11 masters by memory
        result = plan(Workload(0, 0, backlog / 500 * 10), COSTS, LIMITS)
        assert result.shards % result.masters == 0 and result.shards >= 16, result


def test_past_the_shard_cap_slot_spread_binds() -> None:
    result = plan(Workload(schedule_rate=0, fire_rate=20_000_000, backlog=0), COSTS, LIMITS)
    assert result.masters > MAX_SHARDS and result.shards == MAX_SHARDS
    assert result.binding == "slot spread"
    assert any("prefixes" in note for note in result.notes)


def test_the_batch_is_cut_to_the_blocking_limit() -> None:
    limits = replace(LIMITS, max_block_us=1_100)  # (1100 - 100) / 10 = 100 items per claim
    result = plan(Workload(0, 1_000, 0), COSTS, limits)
    assert (result.batch, result.claim_block_us) == (100, 1_100)
    assert any("batch cut from 200 to 100" in note for note in result.notes)
    # smaller batches pay the per-call costs over fewer items: more CPU per item
    assert result.cpu_per_master > plan(Workload(0, 1_000, 0), COSTS, LIMITS).cpu_per_master


def test_a_claim_call_over_the_blocking_limit_is_refused() -> None:
    with pytest.raises(ConfigError, match="raise max_block_us"):
        plan(Workload(0, 1, 0), COSTS, replace(LIMITS, max_block_us=50))


def test_more_work_never_needs_less() -> None:
    previous = plan(Workload(0, 0, 0), COSTS, LIMITS)
    for k in range(1, 40):
        current = plan(Workload(k * 30_000, k * 50_000, k * 1e8), COSTS, LIMITS)
        assert current.masters >= previous.masters and current.forwarders >= previous.forwarders
        assert current.shards >= current.masters  # every master holds a shard (not monotonic: 15 → 30, 20 → 20)
        previous = current


def test_forward_rate_adds_python_server_and_round_trips() -> None:
    assert predict_forward_rate(COSTS, 100, rtt_us=0, round_trips_per_batch=3) == pytest.approx(1e6 / (20 + 16 + 2))
    assert predict_forward_rate(COSTS, 100, rtt_us=500, round_trips_per_batch=2) == pytest.approx(1e6 / (38 + 10))


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Workload(schedule_rate=-1, fire_rate=0, backlog=0),
        lambda: Workload(schedule_rate=float("nan"), fire_rate=0, backlog=0),
        lambda: Costs(claim_us=-3),
        lambda: Limits(batch=0),
        lambda: Limits(master_cpu_share=1.5),
    ],
)
def test_bad_numbers_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="use a"):
        bad()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("text", "value"),
    [("250000", 250_000), ("10k", 10_000), ("1.5M", 1_500_000), ("1B", 1e9), ("1e6", 1e6), ("1_000", 1000)],
)
def test_amounts(text: str, value: float) -> None:
    assert parse_amount(text) == value


def test_the_command_prints_the_plan() -> None:
    result = CliRunner().invoke(capacity, ["--schedule-rate", "100k", "--fire-rate", "1M", "--backlog", "1B"])
    assert result.exit_code == 0, result.output
    expected = plan(Workload(1e5, 1e6, 1e9))
    assert f"masters:    {expected.masters}  (bound by {expected.binding}" in result.output
    assert f"shards:     {expected.shards}\n" in result.output
    assert f"forwarders: {expected.forwarders} " in result.output


def test_the_command_reads_measured_costs(tmp_path: Path) -> None:
    report = tmp_path / "costs.json"
    report.write_text(json.dumps({"costs": {"bytes_per_item": 2000, "claim_us": 20}, "load": [1.0, 1.0, 1.0]}))
    result = CliRunner().invoke(
        capacity, ["--schedule-rate", "1k", "--fire-rate", "1k", "--backlog", "100M", "--costs", str(report), "--json"]
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["masters_by"]["memory"] == 8  # 200 GB over 25 GB masters
    assert printed["claim_block_us"] == Costs().claim_call_us + 200 * 20


def test_the_command_names_what_is_wrong(tmp_path: Path) -> None:
    result = CliRunner().invoke(capacity, ["--schedule-rate", "lots", "--fire-rate", "1", "--backlog", "1"])
    assert result.exit_code == 2 and "use e.g. 250000, 10k, 1.5M or 1B" in result.output
    report = tmp_path / "costs.json"
    report.write_text(json.dumps({"costs": {"claim_usec": 5}}))
    result = CliRunner().invoke(
        capacity, ["--schedule-rate", "1", "--fire-rate", "1", "--backlog", "1", "--costs", str(report)]
    )
    assert result.exit_code == 2 and "unknown costs ['claim_usec']" in result.output
