"""S4: fuzzed messages on every work subject. No worker crashes; every message ends as a dead letter
or as a Result for the rollout it names; nothing is left in the work stream."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import inspect, topology
from broker.publish import publish_raw
from runtime.engine import audit
from runtime.engine.deadletters import lenient_ids
from runtime.testing import Harness
from tests import fault_suite as fs

SUBJECTS = ["gym.agent.simple_agent", "gym.tool.math", "gym.verify.math"]

scalars = st.none() | st.booleans() | st.integers(-3, 40) | st.floats(allow_nan=False) | st.text(max_size=12)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3))
sids = st.builds("fuzz.{}.{}".format, st.integers(0, 30), st.integers(0, 2)) | st.text(max_size=12)
wire = st.fixed_dictionaries(
    {"kind": st.sampled_from(["start", "resume", "seed", "tools", "verify", "result", "bogus"])},
    optional={
        "run_id": st.just("fuzz") | st.text(max_size=8),
        "task_index": st.integers(-1, 30) | values,
        "rollout_index": st.integers(0, 2) | values,
        "agent": st.sampled_from(["simple_agent", "other"]),
        "env": st.sampled_from(["math", "elsewhere"]),
        "session_id": sids,
        "step": st.integers(-1, 6) | values,
        "calls": st.lists(
            st.fixed_dictionaries(
                {"call_id": st.text(max_size=4), "name": st.text(max_size=10), "arguments": st.text(max_size=20)}
            ),
            max_size=2,
        )
        | values,
        "responses_create_params": st.fixed_dictionaries({"input": values | st.just("What is 6*7?")}) | values,
        "meta": st.fixed_dictionaries({"expected_answer": values}) | values,
        "options": st.fixed_dictionaries({}, optional={"max_steps": values, "rollout_timeout_s": st.floats(0.5, 5)}),
    },
)
payloads = (
    st.binary(max_size=64) | wire.map(lambda d: json.dumps(d).encode()) | values.map(lambda v: json.dumps(v).encode())
)


def generate(n: int) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []

    @settings(max_examples=n, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(SUBJECTS), payloads)
    def collect(subject: str, payload: bytes) -> None:
        out.append((subject, payload))

    collect()
    return out


async def test_fuzzed_messages_end_as_dead_letters_or_results(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYMBUS_ORPHAN_AFTER_S", "1")
    monkeypatch.setenv("GYMBUS_JANITOR_INTERVAL_S", "0.5")
    await harness.simulate(fs.MATH_TASKS, accuracy=1.0)
    workers = [await harness.worker("simple_agent"), await harness.worker("math")]
    valid = fs.starts("fuzz", 10)
    await fs.submit(harness, valid)  # real rollouts, with fuzz naming their sessions racing them
    sent: list[tuple[int, bytes]] = []
    for i, (subject, payload) in enumerate(generate(int(os.environ.get("GYMBUS_FUZZ_EXAMPLES", "150")))):
        ack = await publish_raw(harness.js, subject, payload, {"Nats-Msg-Id": f"fuzz-{i}"})
        sent.append((ack.seq, payload))

    await harness.settled(timeout=90)  # every message acked, terminated or dead-lettered; no handler running
    assert all(not t.done() for _, t in harness._workers), "a worker stopped"
    dead = {json.loads(m.data)["stream_seq"] async for m in inspect.messages(harness.js, topology.DEAD_STREAM)}
    a = await audit.audit(harness.js, "fuzz", set())
    resulted = set(a.latest)
    unaccounted = [p for seq, p in sent if seq not in dead and not _named_result(p, resulted)]
    assert not unaccounted, unaccounted[:5]
    assert a.duplicates == 0, await _results_of(harness, a.duplicated)
    assert all(r.reward is None for r in a.latest.values() if r.failed)
    assert all(a.latest[sid].reward == 1.0 for sid in fs.sids(valid)), [a.latest.get(sid) for sid in fs.sids(valid)]
    assert sum(w.stats["processed"] for w in workers) > 0


def _named_result(payload: bytes, resulted: set[str]) -> bool:
    ids = lenient_ids(payload)
    return ids is not None and ids[0] in resulted


async def _results_of(h: Harness, sids: set[str]) -> list[object]:
    from broker.schemas import result_decoder

    out = []
    async for m in inspect.messages(h.js, topology.RESULTS_STREAM, topology.result_subject("fuzz")):
        r = result_decoder.decode(m.data)
        if r.session_id in sids:
            out.append((m.headers, r.failure_kind, r.failure_reason, r.timings.hops))
    return out
