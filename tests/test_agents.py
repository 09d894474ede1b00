"""The agents as a whole: each proves an environment it fits through `gymbus check`, each refuses a run
it does not fit before anything starts (naming both), and the README's agent table lists them all."""

from __future__ import annotations

import json
import pkgutil
import re
from pathlib import Path

import pytest

import functions
from conftest import MATH_TASKS, ROOT
from runtime.checking import check
from runtime.errors import InputError
from runtime.runs.config import load_config
from runtime.runs.plan import prepare
from runtime.sdk import Agent, load


def shipped_agents() -> list[str]:
    names = []
    for info in pkgutil.iter_modules(functions.__path__):
        if info.ispkg and isinstance(fn := load(info.name), Agent):
            names.append(fn.name)
    return sorted(names)


def test_the_readme_table_lists_every_agent() -> None:
    section = (ROOT / "README.md").read_text().split("## Agents", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \| [^|]*\| [^|]*\|$", section, re.M)
    assert sorted(listed) == shipped_agents() and len(shipped_agents()) == 8
    for name in shipped_agents():
        assert (ROOT / "configs" / f"{name}.yaml").is_file() or name in ("simple_agent", "one_shot"), name
        assert (ROOT / "functions" / name / "README.md").is_file()


@pytest.mark.parametrize(
    ("env", "agent"),
    [
        ("mcqa", "user_sim_agent"),
        ("math", "tool_simulation_agent"),
        ("string_match", "refinement_agent"),
        ("wordle", "compaction_agent"),
        ("blackjack", "step_agent"),
    ],
)
async def test_an_environment_checks_both_ways_through_the_agent(env: str, agent: str) -> None:
    report = await check(env, agent=agent)
    assert report.ok, [t.problems for t in report.tasks]


def config(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "run.yaml"
    base = {"input": str(MATH_TASKS), "agent": "simple_agent", "env": "math", "output": str(tmp_path / "runs")}
    path.write_text(json.dumps({**base, **fields}))
    return path


COUNTER = str(ROOT / "functions" / "counter" / "data" / "example.jsonl")
WORDLE = str(ROOT / "functions" / "wordle" / "data" / "example.jsonl")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"agent": "step_agent"}, "agent 'step_agent' does not fit environment 'math': it has no steps"),
        (
            {"agent": "tool_simulation_agent", "env": "counter", "input": COUNTER},
            "agent 'tool_simulation_agent' does not fit environment 'counter': its verifier scores the state",
        ),
        (
            {"agent": "refinement_agent", "env": "wordle", "input": WORDLE},
            "agent 'refinement_agent' does not fit environment 'wordle': a game's episode cannot be corrected",
        ),
        (
            {"agent": "harness_agent", "agent_options": {"command": ["no-such-harness"]}},
            "agent 'harness_agent' does not fit agent_options.command ['no-such-harness']: 'no-such-harness' is not",
        ),
        (
            {"agent": "user_sim_agent", "model": {"base_url": "http://127.0.0.1:1/v1"}},
            "agent 'user_sim_agent' does not fit model 'user_sim' (user simulator): nothing serves it in this run",
        ),
        (
            {"agent": "compaction_agent", "agent_options": {"policy": "summarize", "summarizer": "big"}},
            "agent 'compaction_agent' does not fit model 'big' (summarizer): no model of that name in this run",
        ),
    ],
)
async def test_a_run_the_agent_does_not_fit_is_refused_before_it_starts(
    tmp_path: Path, fields: dict[str, object], says: str
) -> None:
    with pytest.raises(InputError) as refused:
        await prepare(load_config(config(tmp_path, **fields)), None, check_model=False)
    assert str(refused.value).startswith(says), refused.value
    assert not (tmp_path / "runs").exists()


async def test_a_model_under_models_with_a_base_url_fits(tmp_path: Path) -> None:
    fields = {
        "agent": "user_sim_agent",
        "model": {"base_url": "http://127.0.0.1:1/v1"},
        "models": {"user_sim": {"base_url": "http://127.0.0.1:2/v1"}},
    }
    plan = await prepare(load_config(config(tmp_path, **fields)), None, check_model=False)
    assert [(m.name, m.role) for m in plan.agent_models] == [("user_sim", "user_simulator")]
