"""A message a worker publishes after a commit (to an environment, or an agent's Resume) carries the
session it applies to, as just committed, so a first delivery skips reading the sessions bucket;
the compare-and-set on the carried revision stays the fence, and a redelivery reads the bucket
before redoing anything. A Resume's session is trusted only on the resume subject, where
submitters may not publish."""

from __future__ import annotations

import time

import msgspec
import pytest
from nats.js import JetStreamContext

from broker import topology
from broker.schemas import (
    FunctionCall,
    Resume,
    Session,
    Tools,
    agent_decoder,
    session_decoder,
    session_encoder,
    verify_decoder,
)
from broker.sessions import SessionStore
from conftest import MATH_TASKS
from runtime.engine.agents import handle_agent
from runtime.engine.environments import handle_tool
from runtime.engine.records import new_session
from runtime.engine.transitions import Delivery, RolledBack, Runtime, SessionLost, next_message
from runtime.errors import Retry
from runtime.model.client import ModelOutput
from runtime.sdk import Environment, Rollout, Task, load, tool
from runtime.testing import Harness, task_rows

ROW = task_rows(MATH_TASKS)[0]


class Counting(SessionStore):
    """The real store, counting its reads."""

    def __init__(self, js: JetStreamContext) -> None:
        super().__init__(js)
        self.reads = 0

    async def get(self, sid: str, *, any_replica: bool = False) -> tuple[Session, int] | None:
        self.reads += 1
        return await super().get(sid, any_replica=any_replica)


class Env:
    """An environment whose one tool counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

        @tool
        async def count() -> str:
            """Counts."""
            self.calls += 1
            return str(self.calls)

        async def verify(task: Task, rollout: Rollout) -> float:  # type: ignore[type-arg]
            return 1.0

        self.env = Environment(name="counts", tools=[count], verify=verify)


async def _at_tools(harness: Harness, run_id: str) -> tuple[Session, int]:
    """A session waiting on one call of ``count``, committed; and its revision."""
    s = new_session(
        harness.start(ROW, run_id=run_id, agent="simple_agent", env="counts"), 0, Delivery(published_at=time.time())
    )
    s.phase, s.step = "tools", 1
    s.pending = [FunctionCall(call_id="c1", name="count", arguments="{}")]
    return s, await harness.store.create(s)


def _carrying(s: Session, rev: int) -> Tools:
    return Tools(
        session_id=s.session_id,
        step=s.step,
        attempt=s.attempt,
        calls=s.pending,
        state=session_encoder.encode(s),
        rev=rev,
    )


async def test_a_first_delivery_takes_the_carried_session_and_a_redelivery_reads_the_bucket(harness: Harness) -> None:
    e, store = Env(), Counting(harness.js)
    rt = Runtime(harness.js, store)
    s, rev = await _at_tools(harness, "carry")
    msg = _carrying(s, rev)

    await handle_tool(rt, e.env, msg, Delivery(published_at=time.time()))
    assert (store.reads, e.calls) == (0, 1)  # applied from the message alone
    loaded = await harness.store.get(s.session_id)
    assert loaded is not None and loaded[0].step == 2 and loaded[0].phase == "model"
    assert [i["output"] for i in loaded[0].items if i.get("type") == "function_call_output"] == ["1"]

    await handle_tool(rt, e.env, msg, Delivery(published_at=time.time(), num_delivered=2))
    assert store.reads >= 1 and e.calls == 1  # the bucket said the step was done: no second tool call
    again = await harness.store.get(s.session_id)
    assert again is not None and again[1] == loaded[1]


async def test_a_stale_carried_session_loses_its_compare_and_set(harness: Harness) -> None:
    """A first delivery of a message whose step another delivery already applied (a copy published
    again after the duplicate window) redoes the work, and the compare-and-set refuses it."""
    e = Env()
    rt = Runtime(harness.js, harness.store)
    s, rev = await _at_tools(harness, "stale")
    msg = _carrying(s, rev)
    await handle_tool(rt, e.env, msg, Delivery(published_at=time.time()))
    done = await harness.store.get(s.session_id)
    await handle_tool(rt, e.env, msg, Delivery(published_at=time.time()))
    after = await harness.store.get(s.session_id)
    assert done is not None and after is not None
    assert e.calls == 2 and after[1] == done[1]  # the second run's outputs were not committed
    assert [i["output"] for i in after[0].items if i.get("type") == "function_call_output"] == ["1"]


async def test_a_carried_session_whose_key_is_gone_is_lost_not_dropped(harness: Harness) -> None:
    """Gone while the message is fresh: no other copy of it could have taken the session on, so the
    session was lost whole (a power cut) and the rollout starts over from the carried one. Gone after
    the duplicate window: it may have finished and expired, so the rollout is not started again."""
    e = Env()
    rt = Runtime(harness.js, harness.store)
    s, rev = await _at_tools(harness, "gone")
    msg = _carrying(s, rev)
    await harness.store.delete(s.session_id)
    with pytest.raises(RolledBack) as caught:
        await handle_tool(rt, e.env, msg, Delivery(published_at=time.time()))
    assert caught.value.session == s and "is gone though its message carried it" in str(caught.value)
    with pytest.raises(SessionLost):
        await handle_tool(rt, e.env, msg, Delivery(published_at=time.time() - rt.dedupe_s - 1))


async def test_a_carried_session_that_loses_its_compare_and_set_is_read_from_the_bucket(harness: Harness) -> None:
    """The bucket holds the session at the message's step under another revision (its write was
    redone after a power cut): the step is applied to the bucket's session, not dropped."""
    e = Env()
    rt = Runtime(harness.js, harness.store)
    s, rev = await _at_tools(harness, "redone")
    msg = _carrying(s, rev)
    again = await harness.store.update(s, last=rev)  # the same step, written again
    await handle_tool(rt, e.env, msg, Delivery(published_at=time.time()))
    loaded = await harness.store.get(s.session_id)
    assert loaded is not None and loaded[1] > again and (loaded[0].step, loaded[0].phase) == (2, "model")
    assert e.calls == 2  # once on the carried session (refused), once on the bucket's (committed)
    assert [i["output"] for i in loaded[0].items if i.get("type") == "function_call_output"] == ["2"]


async def test_a_committed_step_sends_its_session_to_the_environment(harness: Harness) -> None:
    """The Verify a commit publishes carries the record and revision the bucket now holds."""
    rt = Runtime(harness.js, harness.store)
    s, rev = await _at_tools(harness, "sent")
    s.phase, s.pending = "verify", []
    assert await rt.commit(s, rev, Delivery(published_at=time.time()), time.perf_counter())
    stored = await harness.store.get(s.session_id)
    raw = await harness.js.get_msg(topology.WORK_STREAM, subject=topology.verify_subject("counts"))
    assert stored is not None and raw.data is not None
    verify = verify_decoder.decode(raw.data)
    assert verify.rev == stored[1] and verify.state is not None
    assert session_decoder.decode(verify.state) == stored[0]


async def test_a_committed_step_sends_its_session_to_the_agent_on_its_resume_subject(harness: Harness) -> None:
    """The Resume a commit publishes goes to the subject only workers may publish to, carrying the
    record and revision the bucket now holds."""
    rt = Runtime(harness.js, harness.store)
    s, rev = await _at_tools(harness, "resumed")
    s.phase, s.pending = "model", []
    assert await rt.commit(s, rev, Delivery(published_at=time.time()), time.perf_counter())
    stored = await harness.store.get(s.session_id)
    assert await harness.pending(topology.agent_subject("simple_agent")) == 0
    raw = await harness.js.get_msg(topology.WORK_STREAM, subject=topology.resume_subject("simple_agent"))
    assert stored is not None and raw.data is not None
    resume = agent_decoder.decode(raw.data)
    assert isinstance(resume, Resume) and resume.rev == stored[1] and resume.state is not None
    assert session_decoder.decode(resume.state) == stored[0]


async def test_a_resume_carries_its_session_only_on_the_subject_submitters_cannot_publish_to(
    harness: Harness,
) -> None:
    """On the resume subject the agent takes the carried session and reads nothing. The same Resume
    on the subject Starts share could come from a submitter: there its session (here with the
    verifier's expected answer changed) is ignored and the bucket's is used."""
    seen: list[dict] = []  # type: ignore[type-arg]

    async def respond(items: list, params: dict, s: Session) -> ModelOutput:  # type: ignore[type-arg]
        seen.append(s.meta)
        return ModelOutput([{"type": "message", "role": "assistant", "content": "\\boxed{1}"}], s.usage, {})

    store = Counting(harness.js)
    rt = Runtime(harness.js, store, respond=respond)
    agent = load("simple_agent")
    for run_id, subject in (("trusted", topology.resume_subject), ("forged", topology.agent_subject)):
        s, rev = await _at_tools(harness, run_id)
        s.phase, s.pending, s.step = "model", [], 2
        rev = await harness.store.update(s, last=rev)
        sent, resume = next_message(s, (session_encoder.encode(s), rev))
        assert sent == topology.resume_subject("simple_agent") and isinstance(resume, Resume)
        if run_id == "forged":
            forged = msgspec.structs.replace(s, meta={**s.meta, "expected_answer": "1"})
            resume = msgspec.structs.replace(resume, state=session_encoder.encode(forged))
        store.reads = 0
        await handle_agent(rt, agent, resume, Delivery(published_at=time.time(), subject=subject("simple_agent")))
        committed = await harness.store.get(s.session_id)
        assert committed is not None and (committed[0].step, committed[0].phase) == (3, "verify")
        assert committed[0].meta == s.meta and seen[-1] == s.meta, run_id
        assert store.reads == (0 if run_id == "trusted" else 1), run_id


async def test_a_message_of_an_earlier_attempt_is_stale_at_the_same_step(harness: Harness) -> None:
    """An attempt started over from a rolled-back session can reach the step an earlier attempt's
    surviving message names: the message's attempt keeps it from being applied there."""
    e = Env()
    rt = Runtime(harness.js, harness.store)
    s, rev = await _at_tools(harness, "attempts")
    s.attempt = 1
    rev = await harness.store.update(s, last=rev)
    older = Tools(session_id=s.session_id, step=s.step, calls=s.pending)  # attempt 0
    await handle_tool(rt, e.env, older, Delivery(published_at=time.time(), num_delivered=2))
    unchanged = await harness.store.get(s.session_id)
    assert e.calls == 0 and unchanged is not None and unchanged[1] == rev

    await handle_tool(rt, e.env, _carrying(s, rev), Delivery(published_at=time.time()))  # attempt 1
    applied = await harness.store.get(s.session_id)
    assert e.calls == 1 and applied is not None and (applied[0].step, applied[0].attempt) == (2, 1)
    raw = await harness.js.get_msg(topology.WORK_STREAM, subject=topology.resume_subject("simple_agent"))
    assert (raw.headers or {}).get("Nats-Msg-Id") == f"{s.session_id}:2:1"  # the attempt in the dedupe key


async def test_a_session_behind_its_message_is_looked_at_again_then_rolled_back(harness: Harness) -> None:
    """A session the leader shows behind the message in hand lost the write the message followed:
    the first delivery asks for redelivery, a later one reports the rollback (the worker then
    starts the rollout over)."""
    e = Env()
    rt = Runtime(harness.js, harness.store)
    s, _ = await _at_tools(harness, "behind")
    ahead = Tools(session_id=s.session_id, step=s.step + 1, calls=s.pending)
    with pytest.raises(Retry):
        await handle_tool(rt, e.env, ahead, Delivery(published_at=time.time()))
    with pytest.raises(RolledBack) as caught:
        await handle_tool(rt, e.env, ahead, Delivery(published_at=time.time(), num_delivered=2))
    assert caught.value.at == s.step and e.calls == 0
    assert "at step 1, behind its message's step 2" in str(caught.value)
