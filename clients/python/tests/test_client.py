"""The client against a real validator daemon and real CPU miners on loopback."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import binary

from gpu_attest_client import (
    AlreadyExists,
    AsyncClient,
    Client,
    DeadlineExceeded,
    FailedPrecondition,
    GpuAttestError,
    InvalidArgument,
    NotFound,
    OutOfRange,
    Phase,
    Progress,
    RateSource,
    ReasonCode,
    Unavailable,
    Verdict,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def api(validator):
    with Client(validator.url) as client:
        yield client


def test_miners_are_registered_listed_renamed_and_removed(api, honest_miner):
    record = api.register_miner(honest_miner.url, "rig-1")
    assert (record.url, record.name) == (honest_miner.url, "rig-1")
    # The miner said, as it was registered, that it allows this validator; a listing says nothing.
    assert record.allows_this_validator is True
    assert len(record.miner_key) == 64 and int(record.miner_key, 16) >= 0
    listed = [m for m in api.list_miners() if m.url == honest_miner.url]
    assert [(m.name, m.allows_this_validator) for m in listed] == [("rig-1", None)]
    renamed = api.register_miner(honest_miner.url, "rig-one")
    assert (renamed.name, renamed.miner_key) == ("rig-one", record.miner_key)
    assert api.remove_miner(honest_miner.url) is True
    assert api.remove_miner(honest_miner.url) is False
    assert honest_miner.url not in [m.url for m in api.list_miners()]


def test_an_attestation_shows_its_phases_and_progress_then_the_stored_verdict(api, honest_miner):
    events = []
    verdict = api.attest(honest_miner.url, on_event=events.append)
    assert verdict.passed, verdict.reasons
    assert verdict.reasons == [] and verdict.codes == []
    phases = [e.name for e in events if isinstance(e, Phase)]
    assert phases[:2] == ["challenge-sent", "computing"], phases
    assert "verifying" in phases
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress and all(0 < p.done <= p.total for p in progress if p.total)
    # First contact: timed by the shipped table, so a weights policy can weigh it down.
    assert verdict.rate_source == RateSource.SHIPPED and verdict.first_contact
    assert verdict.proven_ops_per_sec > 0 and verdict.proven_to_expected > 0
    # With its memory phase, judged under protocol version 4 (the default); a CPU's walk is paced
    # by hashing, so it shows no share of the claim held, and says 0 rather than nothing.
    assert verdict.protocol_version == 4
    assert verdict.proven_memory_bytes == 0
    assert verdict.backend == "cpu" and len(verdict.devices) == 1
    stored = next(api.list_verdicts(miner_url=honest_miner.url, limit=1))
    assert (stored.id, stored.passed, stored.miner_key) == (verdict.id, True, verdict.miner_key)
    # Registered, its standing shows the verdict.
    api.register_miner(honest_miner.url)
    standing = next(m for m in api.list_miners() if m.url == honest_miner.url)
    assert (standing.last_verdict_id, standing.last_verdict_passed) == (verdict.id, True)
    assert standing.last_pass_at == standing.last_verdict_at == verdict.created_at
    assert not standing.revoked and standing.failures_in_a_row == 0


def test_a_failed_verdict_gives_its_reasons_as_codes(api, cheating_miner):
    verdict = api.attest(cheating_miner.url)
    assert not verdict.passed
    assert ReasonCode.GLOBAL_CHECKSUM_MISMATCH in verdict.codes, verdict.reasons
    assert all(isinstance(r.code, ReasonCode) and r.message for r in verdict.reasons)
    failed = list(api.list_verdicts(passed=False))
    assert verdict.id in [v.id for v in failed]
    assert all(not v.passed for v in failed)


def test_a_failed_verdicts_transcript_is_saved_and_audits_offline(api, cheating_miner, honest_miner, workdir):
    """A FAIL keeps its transcript (PROTOCOL.md 21) by default; the client saves it through the
    API, and ``validator audit`` re-derives the verdict from that file alone."""
    verdict = api.attest(cheating_miner.url)
    assert not verdict.passed
    listed = next(v for v in api.list_verdicts(passed=False) if v.id == verdict.id)
    assert listed.transcript_bytes and listed.transcript_bytes > 0
    path = workdir / f"verdict-{verdict.id}.transcript"
    assert api.save_transcript(verdict.id, path) == listed.transcript_bytes
    with pytest.raises(FileExistsError):
        api.save_transcript(verdict.id, path)
    audited = subprocess.run(
        [binary("validator"), "audit", str(path), "--json"], capture_output=True, text=True
    )
    report = json.loads(audited.stdout)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert report["finding"] == "confirmed" and not report["differs"], report
    # A pass keeps none by default: asking for it is NotFound, with what to change.
    passed = api.attest(honest_miner.url)
    assert passed.passed and passed.transcript_bytes is None
    with pytest.raises(NotFound) as none:
        api.transcript(passed.id)
    assert "keep" in none.value.message
    # Saved as it arrives: a transfer that fails leaves no file behind.
    missing = workdir / f"verdict-{passed.id}.transcript"
    with pytest.raises(NotFound):
        api.save_transcript(passed.id, missing)
    assert not missing.exists()


def test_a_verdicts_json_is_the_validators_own(api, honest_miner, cheating_miner, v4_miner, workdir):
    """One schema (PROTOCOL.md 16.1): ``to_json()`` of each listed verdict is the object
    ``validator verdicts --json`` prints for it from the database, field for field, a pass and
    a fail among them, and a version 4 verdict with each device's own walk."""
    api.attest(honest_miner.url)
    api.attest(cheating_miner.url)
    v4 = api.attest(v4_miner.url)
    assert v4.passed and v4.protocol_version == 4, v4.reasons
    from_client = {v.id: v.to_json() for v in api.list_verdicts()}
    listed = subprocess.run(
        [binary("validator"), "verdicts", "--json", "--database", str(workdir / "validator.db")],
        check=True, capture_output=True, text=True,
    ).stdout
    from_database = {v["id"]: v for v in json.loads(listed)}
    assert from_client == from_database
    assert any(not v["passed"] for v in from_client.values())
    walk = from_client[v4.id]["memory"]["devices"][0]["walk"]
    assert walk["measured_ms"] > 0 and walk["proven_bytes_per_sec"] > 0
    # A CPU is no model of the design's table: opened as its worst row, and bound as a CPU,
    # whose hash-paced walk shows nothing of its memory.
    assert (walk["steps_opened"], walk["sized_as"], walk["bound_as"]) == (1649, "", "a CPU")
    assert walk["held_at_least"] == 0.0


def test_the_rate_table_lists_the_class_just_attested(api, honest_miner):
    # Only registered miners teach the validator their class.
    api.register_miner(honest_miner.url, "rates")
    try:
        assert api.attest(honest_miner.url).passed
        table = api.list_rates()
    finally:
        api.remove_miner(honest_miner.url)
    cpu = [c for c in table.classes if c.backend == "cpu" and c.kernel not in ("walk", "walk-v4")]
    assert cpu and all(c.ops_per_sec > 0 and c.unit == "core" for c in cpu), table
    assert table.calibration_min_miners >= 1
    assert any(r.backend == "cpu" for r in table.shipped)


def test_verdicts_are_listed_newest_first_a_page_at_a_time(api, honest_miner):
    for _ in range(2):
        assert api.attest(honest_miner.url).passed
    everything = list(api.list_verdicts(page_size=1))
    assert len(everything) >= 3
    ids = [v.id for v in everything]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    assert [v.id for v in api.list_verdicts(limit=2)] == ids[:2]
    with pytest.raises(ValueError):
        list(api.list_verdicts(page_size=501))


def test_watched_verdicts_arrive_as_stored_and_resume_after_an_id(api, honest_miner):
    newest = next(api.list_verdicts(limit=1)).id
    seen = []
    watching = threading.Thread(
        target=lambda: seen.append(next(iter(api.watch_verdicts(after_id=newest)))), daemon=True
    )
    watching.start()
    verdict = api.attest(honest_miner.url)
    watching.join(timeout=60)
    assert [v.id for v in seen] == [verdict.id]
    # A client that saw up to `newest` misses nothing when it calls again with that id.
    resumed = next(iter(api.watch_verdicts(after_id=newest)))
    assert resumed.id == verdict.id
    with pytest.raises(OutOfRange) as beyond:
        next(iter(api.watch_verdicts(after_id=verdict.id + 1000)))
    assert beyond.value.message


def test_errors_carry_the_status_and_the_validators_message(api, honest_miner, cheating_miner):
    with pytest.raises(InvalidArgument) as no_url:
        api.register_miner("")
    assert "url is required" in no_url.value.message
    with pytest.raises(Unavailable) as nobody:
        api.register_miner("http://127.0.0.1:1")
    assert "127.0.0.1:1" in nobody.value.message
    # One key is one miner: the same miner under a second URL is refused.
    api.register_miner(honest_miner.url)
    alias = honest_miner.url.replace("127.0.0.1", "localhost")
    with pytest.raises(AlreadyExists):
        api.register_miner(alias)
    # A revoked key is never registered again.
    cheater = api.register_miner(cheating_miner.url)
    assert api.revoke_miner_key(cheater.miner_key, "forged checksums") is True
    assert api.revoke_miner_key(bytes.fromhex(cheater.miner_key), "again") is False
    revoked = api.list_revoked_keys()
    assert [(k.miner_key, k.reason) for k in revoked] == [(cheater.miner_key, "forged checksums")]
    assert next(m for m in api.list_miners() if m.url == cheating_miner.url).revoked
    with pytest.raises(FailedPrecondition) as revoked:
        api.register_miner(cheating_miner.url)
    assert "revoked" in revoked.value.message
    with pytest.raises(ValueError):
        api.revoke_miner_key("beef", "too short")


def test_the_asyncio_client_makes_the_same_calls(validator, honest_miner):
    async def run():
        async with AsyncClient(validator.url) as api:
            record = await api.register_miner(honest_miner.url, "async-rig")
            assert record.name == "async-rig"
            assert honest_miner.url in [m.url for m in await api.list_miners()]
            events = []
            verdict = await api.attest(honest_miner.url, on_event=events.append)
            assert verdict.passed and any(isinstance(e, Phase) for e in events)
            listed = [v async for v in api.list_verdicts(limit=1)]
            assert listed[0].id == verdict.id
            with pytest.raises(InvalidArgument):
                await api.register_miner("")
            return verdict

    assert isinstance(asyncio.run(run()), Verdict)


@pytest.fixture
def silent_miner_url():
    """A "miner" that takes connections and never answers: an attestation of it outlives any
    deadline, and stores no verdict that a later test would see."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        yield f"http://127.0.0.1:{silent.getsockname()[1]}"


def test_the_asyncio_client_answers_and_fails_as_the_blocking_one(api, validator, honest_miner, silent_miner_url):
    """Both clients carry out the same calls: each asyncio call gives what the blocking one
    gives, and fails with the same exception and message, whether the validator refuses a call,
    a stream fails, a stream outlives its deadline, or the client's own checks refuse it."""
    api.register_miner(honest_miner.url, "both")
    newest = api.attest(honest_miner.url).id
    # Each call, and how many values to take where it is iterated (a watch never ends by itself).
    answers = [
        (lambda c: c.list_miners(), None),
        (lambda c: c.list_revoked_keys(), None),
        (lambda c: c.list_rates(), None),
        (lambda c: c.remove_miner("http://127.0.0.1:1"), None),
        (lambda c: c.list_verdicts(page_size=2, limit=5), None),
        (lambda c: c.list_verdicts(honest_miner.url, passed=True, limit=3), None),
        (lambda c: c.watch_verdicts(after_id=newest - 1), 1),
    ]
    alias = honest_miner.url.replace("127.0.0.1", "localhost")
    failures = [
        (InvalidArgument, lambda c: c.register_miner(""), None),
        (Unavailable, lambda c: c.register_miner("http://127.0.0.1:1"), None),
        (AlreadyExists, lambda c: c.register_miner(alias), None),
        (OutOfRange, lambda c: c.watch_verdicts(after_id=newest + 1000), 1),
        (ValueError, lambda c: c.revoke_miner_key("beef", "too short"), None),
        (ValueError, lambda c: c.list_verdicts(page_size=501), None),
        (DeadlineExceeded, lambda c: c.attest(silent_miner_url, timeout=0.5), None),
    ]

    def blocking(call, take):
        try:
            answer = call(api)
            return list(itertools.islice(answer, take)) if hasattr(answer, "__next__") else answer
        except (GpuAttestError, ValueError) as e:
            return type(e), str(e)

    async def awaited(client, call, take):
        try:
            answer = call(client)
            if not hasattr(answer, "__anext__"):
                return await answer
            taken = []
            async for value in answer:
                taken.append(value)
                if len(taken) == take:
                    break
            await answer.aclose()
            return taken
        except (GpuAttestError, ValueError) as e:
            return type(e), str(e)

    async def all_awaited(calls):
        async with AsyncClient(validator.url) as client:
            return [await awaited(client, call, take) for call, take in calls]

    expected = [blocking(call, take) for call, take in answers]
    assert asyncio.run(all_awaited(answers)) == expected
    expected = [blocking(call, take) for _, call, take in failures]
    assert [raised for raised, _ in expected] == [kind for kind, _, _ in failures]
    assert asyncio.run(all_awaited([(call, take) for _, call, take in failures])) == expected


def test_api_addresses_are_checked_before_connecting():
    for bad in ("127.0.0.1:7071", "ftp://127.0.0.1:7071", "http://127.0.0.1:7071/v1"):
        with pytest.raises(ValueError):
            Client(bad)
    with pytest.raises(ValueError, match="TLS files"):
        Client("http://127.0.0.1:7071", ca="ca.pem")
    with pytest.raises(ValueError, match="both or neither"):
        Client("https://127.0.0.1:7071", cert="client.pem")


def test_the_weights_example_scores_passes_and_zeroes_cheaters(validator, honest_miner, cheating_miner, v4_miner):
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "weights.py"), "--api", validator.url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    weights = json.loads(run.stdout)
    assert weights[cheating_miner.url] == 0.0
    assert weights[honest_miner.url] > 0.0
    # The module's other attested miner says version 4: where the JSON test ran first, its
    # passes share the weight with the honest miner's; nobody else has any.
    assert set(weights) <= {honest_miner.url, cheating_miner.url, v4_miner.url}
    assert weights[honest_miner.url] + weights.get(v4_miner.url, 0.0) == pytest.approx(1.0)
    assert sum(weights.values()) == pytest.approx(1.0)
