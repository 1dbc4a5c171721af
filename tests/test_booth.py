"""Booth policy: settings from the environment, quota decisions, the submission ledger, the submit lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from playground.booth import (
    HOUR,
    BoothPolicy,
    QuotaExceeded,
    SubmissionLedger,
    booth_enabled,
    owner_key,
    submit_lock,
    validate_owner,
)
from playground.errors import UserError
from playground.events import Queued, event_from_dict, event_to_dict, format_event_line, parse_line


@dataclass
class FakeJob:
    done: bool


def test_policy_defaults_and_env_settings():
    assert BoothPolicy.from_settings({}) is None  # booth mode off: no limits
    policy = BoothPolicy.from_settings({"PLAYGROUND_BOOTH": "1"})
    assert policy == BoothPolicy()
    assert (policy.max_running_per_owner, policy.max_concurrent_trainings) == (1, 1)
    env = {
        "PLAYGROUND_BOOTH": "yes",
        "PLAYGROUND_BOOTH_MAX_RUNNING_PER_VISITOR": "2",
        "PLAYGROUND_BOOTH_MAX_JOBS_PER_HOUR": "10",
        "PLAYGROUND_BOOTH_MAX_CONCURRENT_TRAININGS": " 3 ",
        "PLAYGROUND_BOOTH_JOB_DEADLINE_SECONDS": "600",
        "PLAYGROUND_BOOTH_FINISHED_TTL_SECONDS": "0",
    }
    assert BoothPolicy.from_settings(env) == BoothPolicy(2, 10, 3, 600, 0)
    assert (policy.max_servers, policy.max_adapters) == (4, 32)  # base servers with adapters on them
    fewer = {"PLAYGROUND_BOOTH": "1", "PLAYGROUND_BOOTH_MAX_ADAPTERS": "2", "PLAYGROUND_BOOTH_MAX_SERVERS": "3"}
    assert (BoothPolicy.from_settings(fewer).max_adapters, BoothPolicy.from_settings(fewer).max_servers) == (2, 3)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PLAYGROUND_BOOTH": "maybe"}, r"^PLAYGROUND_BOOTH: 'maybe' is not a boolean; allowed: 1, true, yes, on, 0,"),
        (
            {"PLAYGROUND_BOOTH": "1", "PLAYGROUND_BOOTH_MAX_JOBS_PER_HOUR": "six"},
            r"^PLAYGROUND_BOOTH_MAX_JOBS_PER_HOUR: 'six' is not an integer; allowed: an integer >= 1$",
        ),
        (
            {"PLAYGROUND_BOOTH": "1", "PLAYGROUND_BOOTH_MAX_JOBS_PER_HOUR": "\uff16"},  # fullwidth 6: ASCII only
            r"^PLAYGROUND_BOOTH_MAX_JOBS_PER_HOUR: '\uff16' is not an integer; allowed: an integer >= 1$",
        ),
        (
            {"PLAYGROUND_BOOTH": "on", "PLAYGROUND_BOOTH_MAX_CONCURRENT_TRAININGS": "0"},
            r"^PLAYGROUND_BOOTH_MAX_CONCURRENT_TRAININGS: 0 is out of range; allowed: an integer >= 1$",
        ),
        (
            {"PLAYGROUND_BOOTH": "true", "PLAYGROUND_BOOTH_FINISHED_TTL_SECONDS": "-5"},
            r"^PLAYGROUND_BOOTH_FINISHED_TTL_SECONDS: -5 is out of range; allowed: an integer >= 0$",
        ),
        (
            {"PLAYGROUND_BOOTH": "1", "PLAYGROUND_BOOTH_MAX_ADAPTERS": "0"},
            r"^PLAYGROUND_BOOTH_MAX_ADAPTERS: 0 is out of range; allowed: an integer >= 1$",
        ),
    ],
)
def test_bad_settings_are_one_line_naming_the_setting(env, message):
    with pytest.raises(UserError, match=message) as info:
        BoothPolicy.from_settings(env)
    assert "\n" not in str(info.value) and info.value.field in env


def test_policy_validates_values_given_in_code():
    with pytest.raises(UserError, match=r"job_deadline_seconds \(PLAYGROUND_BOOTH_JOB_DEADLINE_SECONDS\): 0"):
        BoothPolicy(job_deadline_seconds=0)
    with pytest.raises(UserError, match="max_running_per_owner"):
        BoothPolicy(max_running_per_owner=True)  # a bool is no count
    with pytest.raises(UserError, match=r"max_adapters \(PLAYGROUND_BOOTH_MAX_ADAPTERS\): 0 is not allowed"):
        BoothPolicy(max_adapters=0)
    assert booth_enabled({"PLAYGROUND_BOOTH": "Off"}) is False


def test_one_running_job_per_visitor():
    policy = BoothPolicy()
    policy.check_quota([FakeJob(done=True)], [], now=1000.0)  # finished jobs do not count
    with pytest.raises(QuotaExceeded, match=r"^you already have a job running; wait for it to finish or cancel it$"):
        policy.check_quota([FakeJob(done=True), FakeJob(done=False)], [], now=1000.0)
    two = BoothPolicy(max_running_per_owner=2)
    two.check_quota([FakeJob(done=False)], [], now=1000.0)
    with pytest.raises(QuotaExceeded, match="you already have 2 jobs running"):
        two.check_quota([FakeJob(done=False)] * 2, [], now=1000.0)


def test_hourly_cap_says_when_to_come_back():
    policy = BoothPolicy(max_jobs_per_owner_per_hour=3)
    now = 10 * HOUR
    policy.check_quota([], [now - HOUR - 1, now - 50, now - 40], now=now)  # one is older than an hour
    with pytest.raises(QuotaExceeded, match=r"^hourly limit of 3 jobs reached; try again in 10 minutes$") as info:
        policy.check_quota([], [now - 3000, now - 50, now - 40], now=now)  # the oldest frees up in 600 s
    assert info.value.retry_after_seconds == pytest.approx(600)
    with pytest.raises(QuotaExceeded, match=r"try again in 1 minute$"):
        policy.check_quota([], [now - HOUR + 5, now - 50, now - 40], now=now)


def test_owner_ids_are_validated_and_hashed_label_safe():
    assert validate_owner(None) is None and validate_owner("visitor-1") == "visitor-1"
    for bad in ("", "   ", "a\nb", "x" * 300):
        with pytest.raises(UserError, match=r"^owner: .* is not a valid visitor id; allowed: 1 to 256 printable"):
            validate_owner(bad)
    key = owner_key("alice@example.com")
    assert len(key) == 32 and key.isalnum() and key == owner_key("alice@example.com") != owner_key("bob")


def test_ledger_survives_deletes_and_forgets_after_an_hour(tmp_path: Path):
    ledger = SubmissionLedger(tmp_path)
    assert ledger.times("alice") == []
    ledger.record("alice", when=100.0)
    ledger.record("bob", when=200.0)
    ledger.record("alice", when=300.0)
    assert SubmissionLedger(tmp_path).times("alice") == [100.0, 300.0]  # another process reads the same
    ledger.record("carol", when=100.0 + HOUR + 1)  # writing prunes entries older than an hour
    assert ledger.times("alice") == [300.0] and ledger.times("bob") == [200.0]


def test_submit_lock_admits_one_at_a_time(tmp_path: Path):
    inside: list[int] = []
    overlaps: list[int] = []
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(20):
            with submit_lock(tmp_path):
                inside.append(i)
                if len(inside) > 1:
                    overlaps.append(i)
                inside.remove(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []


def test_queued_event_round_trips_the_line_protocol():
    event = Queued(position=2, estimated_wait_seconds=75.5, time=12.0)
    assert event_from_dict(event_to_dict(event)) == event
    assert parse_line("2024 " + format_event_line(event)) == event
    assert event_to_dict(Queued(0))["estimated_wait_seconds"] is None
