"""One JSONL with rows of six environments (named by `env` or NeMo Gym's `agent_ref`), one `gymbus collect`:
every row runs on its own environment and agent, and the profile reports every statistic per environment."""

from __future__ import annotations

import json
from pathlib import Path

from runtime.profiling.runfolder import load
from runtime.testing import collect_rows, task_rows

ROOT = Path(__file__).resolve().parent.parent


def examples(env: str, n: int = 2) -> list[dict]:
    return task_rows(ROOT / "functions" / env / "data" / "example.jsonl")[:n]


async def test_a_mixed_run_profiles_each_environment(tmp_path: Path) -> None:
    rows = [
        *examples("mcqa"),  # the run's own environment: no routing field
        *({**r, "env": "string_match"} for r in examples("string_match")),
        *({**r, "env": "counter"} for r in examples("counter")),
        *(
            {**r, "agent_ref": {"type": "responses_api_agents", "name": "arc_agi_simple_agent"}}
            for r in examples("arc_agi")
        ),
        *(
            {**r, "agent_ref": {"type": "responses_api_agents", "name": "xlam_fc_simple_agent"}}
            for r in examples("function_calling")
        ),
        *({**r, "env": "llm_judge"} for r in examples("llm_judge")),
        {**examples("multi_reward", 1)[0], "env": "no_such_env"},
    ]
    summary, out = await collect_rows(tmp_path, rows, env="mcqa", repeats=2, accuracy=1.0)
    by_env = {}
    for r in out:
        by_env.setdefault(r["env"], []).append(r)
    assert sorted(by_env) == [
        "arc_agi",
        "counter",
        "function_calling",
        "llm_judge",
        "mcqa",
        "no_such_env",
        "string_match",
    ]
    assert {r["agent"] for r in by_env["function_calling"]} == {"one_shot"}  # the environment's own agent
    assert all(r["reward"] == 1.0 for env, rs in by_env.items() if env != "no_such_env" for r in rs), [
        (r["env"], r.get("failure_reason")) for r in out if r["reward"] != 1.0
    ]
    [bad, _] = by_env["no_such_env"]
    assert (
        bad["failure_kind"] == "invalid_input"
        and "environment 'no_such_env' is not under functions/" in bad["failure_reason"]
    )

    profile = json.loads((summary.run_dir / "profile.json").read_text())
    assert set(profile["by_env"]) == set(by_env)
    for env, rs in by_env.items():
        part = profile["by_env"][env]
        assert part["present"] == len(rs) and part["tasks"] == len(rs) // 2
        if env != "no_such_env":
            assert part["reward"]["mean"] == 1.0 and part["pass_at_k"][0]["value"] == 1.0
            assert part["latency"]["verify"]["count"] == len(rs)
    assert profile["by_env"]["no_such_env"]["failures"] == {"invalid_input": 2}
    info, samples = load(summary.run_dir)  # offline, from rollouts.jsonl: the same split
    assert {s.env for s in samples} == set(by_env) and info.tasks == len(rows)
