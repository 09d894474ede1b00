"""compaction_agent through a real broker and the simulated policy, on an environment of long pages:
the history is compacted near the context length, and what was compacted is recorded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from broker.schemas import Options, Result, Session
from functions.compaction_agent.agent import AGENT, TOKEN_EXACT, step
from runtime.crashtest import assert_same_rewards, kill_between_steps
from runtime.errors import InvalidInput
from runtime.sdk import AgentContext, Environment, Fit, Reference, Rollout, Task, Unfit, call, tool
from runtime.testing import Harness, task_rows


class Meta(msgspec.Struct, frozen=True):
    code: str


@tool(context=True)
async def read_page(ctx: Any, page: int) -> str:
    """Read a page of the booklet."""
    letter = ctx.task.meta.code[page - 1]
    return f"Page {page}. " + "Nothing of note here. " * 60 + f"The letter on page {page} is {letter}."


async def verify(task: Task[Meta], rollout: Rollout) -> bool:
    return f"\\boxed{{{task.meta.code}}}" in rollout.text


def reference(task: Task[Meta]) -> Reference:
    pages = [call("read_page", page=n) for n in (1, 2, 3)]
    return Reference(right=[*pages, f"\\boxed{{{task.meta.code}}}"], wrong=[pages[0], "\\boxed{ZZZ}"])


PAGES = Environment(name="pages", meta=Meta, tools=[read_page], verify=verify, reference=reference)
SMALL = {"context_tokens": 1000, "threshold": 0.5}


def pages_tasks(tmp_path: Path, n: int = 1) -> Path:
    path = tmp_path / "pages.jsonl"
    ask = {"input": "Read pages 1 to 3; each holds a letter. Answer with the three letters in \\boxed{}."}
    params = {**ask, "tools": PAGES.tool_specs()}
    rows = [{"responses_create_params": params, "code": code} for code in ["CAT", "DOG", "EMU", "OWL"][:n]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def one(h: Harness, tmp_path: Path, options: dict[str, Any], plays: dict[str, str] | None = None) -> Result:
    tasks = pages_tasks(tmp_path)
    await h.simulate(tasks, env=PAGES, accuracy=1.0, plays=plays)
    await h.worker("compaction_agent")
    await h.worker(PAGES)
    await h.submit(h.start(task_rows(tasks)[0], agent="compaction_agent", env="pages", agent_options=options))
    [r] = await h.results("test", 1)
    return r


async def test_old_tool_outputs_are_dropped_and_recorded(harness: Harness, tmp_path: Path) -> None:
    r = await one(harness, tmp_path, {**SMALL, "keep_last": 1})
    assert r.reward == 1.0, r.failure_reason
    compactions = r.agent_info["compactions"]
    assert [(c["turn"], c["policy"], c["items"]) for c in compactions] == [(t, "drop_tool_outputs", 1) for t in (2, 3)]
    for c in compactions:  # past half the context, and compacted by the page's size
        saved = c["estimated_tokens"] - c["estimated_tokens_after"]
        assert c["estimated_tokens"] > 500 and saved > 250 and c["chars"] > 1000
    outputs = [i for i in r.output if i["type"] == "function_call_output"]
    assert [o["output"].startswith("[tool output dropped") for o in outputs] == [True, True, False]
    assert outputs[0]["gymbus"]["source"] == "compaction" and outputs[0]["gymbus"]["dropped_chars"] > 1000


async def test_history_is_summarized_by_the_summarizer_model(harness: Harness, tmp_path: Path) -> None:
    r = await one(harness, tmp_path, {**SMALL, "policy": "summarize"}, plays={"summarizer": "summarizer"})
    assert r.reward == 1.0, r.failure_reason
    assert [(c["turn"], c["items"]) for c in r.agent_info["compactions"]] == [(2, 2), (3, 3)]
    summaries = [i for i in r.output if i.get("gymbus", {}).get("compaction")]
    assert len(summaries) == 1 and summaries[0]["content"].startswith("Summary of the conversation so far:")
    assert summaries[0]["gymbus"] == {"source": "summarizer", "compaction": True, "replaced_items": 3}
    assert r.agent_info["models"]["summarizer"]["calls"] == 2


async def test_no_compaction_below_the_threshold(harness: Harness, tmp_path: Path) -> None:
    r = await one(harness, tmp_path, {})
    assert r.reward == 1.0 and "compactions" not in r.agent_info


class WithTokenExact(Options, frozen=True, kw_only=True):
    token_exact: bool = False  # the model tier's option (one token sequence per rollout)


def test_token_exact_is_refused_by_design() -> None:
    exact = WithTokenExact(token_exact=True)
    fit = Fit(agent="compaction_agent", config=AGENT.config_of({}), envs={}, options=exact, models=frozenset())
    assert AGENT.check is not None
    with pytest.raises(Unfit) as refused:
        AGENT.check(fit)
    assert refused.value.subject == "limits.token_exact: true" and refused.value.why == TOKEN_EXACT
    AGENT.check(dataclasses.replace(fit, options=WithTokenExact()))  # without it: fits


async def test_a_start_asking_for_token_exact_fails_as_invalid_input() -> None:
    s = Session(session_id="r.0.0", run_id="r", task_index=0, agent="compaction_agent", env="e", model="policy",
                step=1, phase="model", params={})  # fmt: skip
    s.options = WithTokenExact(token_exact=True)

    async def never(items: list[dict[str, Any]], params: dict[str, Any], session: Session) -> Any:
        raise AssertionError("no model call may be made")

    with pytest.raises(InvalidInput, match="cannot run with token_exact"):
        await step(AgentContext(s, never, AGENT.config_of({})))


async def test_killed_between_steps_it_resumes_with_the_same_reward(harness: Harness, tmp_path: Path) -> None:
    tasks = pages_tasks(tmp_path, 4)
    await harness.simulate(tasks, env=PAGES, accuracy=0.5, latency_ms=250)
    await harness.worker(PAGES)
    options = {"agent_options": {**SMALL, "keep_last": 1}}
    starts = [
        harness.start(row, agent="compaction_agent", env="pages", task_index=i, **options)
        for i, row in enumerate(task_rows(tasks))
    ]
    clean, killed, kill = await kill_between_steps(harness, "compaction_agent", starts)
    assert_same_rewards(clean, killed)
    assert {r.reward for r in clean} == {0.0, 1.0}
    def when(results: list[Result]) -> list[list[tuple[int, int]]]:  # token estimates vary with the call ids' digits
        return [[(c["turn"], c["items"]) for c in r.agent_info.get("compactions", [])] for r in results]

    assert when(killed) == when(clean) and any(when(clean))
    assert kill.turns >= 1
