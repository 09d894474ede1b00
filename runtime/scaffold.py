"""``gymbus new env NAME`` / ``gymbus new agent NAME``: a function folder that passes ``gymbus check``
as written (its generated test runs the check)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from runtime.errors import InputError

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")

ENV = r'''"""__NAME__: the reward is 1.0 iff the reply's last \\boxed{} holds ``expected_answer`` (case-insensitive)."""

import msgspec

from runtime.answers import last_boxed, normalize
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict


class Meta(msgspec.Struct, frozen=True):
    expected_answer: str


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    answer = last_boxed(rollout.text)
    right = answer is not None and normalize(answer) == normalize(task.meta.expected_answer)
    return Verdict(right, {"extracted_answer": answer})


def reference(task: Task[Meta]) -> Reference:
    return Reference(right=f"\\boxed{{{task.meta.expected_answer}}}", wrong="\\boxed{no idea}")


ENVIRONMENT = Environment(name="__NAME__", meta=Meta, verify=verify, reference=reference)
'''

AGENT = r'''"""__NAME__: a tool loop. Each step calls the model; its tool calls go to the environment, else the
rollout is verified (or after ``max_steps`` model calls)."""

from runtime.sdk import Agent, AgentContext, CallTools, Finish, function_calls


async def step(ctx: AgentContext) -> CallTools | Finish:
    output = await ctx.respond()
    calls = function_calls(output)
    return CallTools(calls) if calls and ctx.turns_taken < ctx.options.max_steps else Finish()


AGENT = Agent(name="__NAME__", step=step)
'''

ENV_TEST = '''"""__NAME__: the verifier proved both ways on the real stack (`gymbus check __NAME__`)."""

from runtime.checking import check


async def test_check_passes_both_ways() -> None:
    report = await check("__REF__")
    assert report.ok, [t.problems for t in report.tasks]
'''

AGENT_TEST = '''"""__NAME__: an environment's check passes through this agent."""

from runtime.checking import check


async def test_an_environment_checks_through_the_agent() -> None:
    report = await check("mcqa", agent="__REF__")
    assert report.ok, [t.problems for t in report.tasks]
'''

QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What colour do you get by mixing blue and yellow?", "green"),
    ("How many legs does a spider have?", "8"),
    ("What is the largest planet of the solar system?", "Jupiter"),
    ("Which element has the chemical symbol O?", "oxygen"),
    ("What is 12 times 12?", "144"),
    ("In which continent is Kenya?", "Africa"),
    ("What is the opposite of 'cold'?", "hot"),
]


def _folder(name: str, root: Path) -> Path:
    if not _IDENT.fullmatch(name):
        raise InputError(f"NAME {name!r}: use lower-case letters, digits and '_' (it becomes a Python package)")
    folder = root / name
    if folder.exists():
        raise InputError(f"{folder} already exists: choose another NAME or remove it")
    (folder / "tests").mkdir(parents=True)
    return folder


def _package(name: str, root: Path) -> str:
    """The import path of the folder: ``functions.NAME`` under functions/, else ``NAME`` (root on sys.path)."""
    return f"functions.{name}" if root.resolve().name == "functions" else name


def _ref(name: str, root: Path, module: str, obj: str) -> str:
    return name if root.resolve().name == "functions" else f"{name}.{module}:{obj}"


def write_env(name: str, root: Path) -> Path:
    """functions/NAME/ with an exact-match environment, 8 example tasks, README, requirements and a test."""
    folder = _folder(name, root)
    (folder / "__init__.py").write_text(
        f'from {_package(name, root)}.env import ENVIRONMENT\n\n__all__ = ["ENVIRONMENT"]\n'
    )
    (folder / "env.py").write_text(ENV.replace("__NAME__", name))
    (folder / "requirements.txt").write_text("")
    (folder / "data").mkdir()
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": f"{q} Answer in \\boxed{{}}."}]},
            "expected_answer": a,
        }
        for q, a in QUESTIONS
    ]
    (folder / "data" / "example.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "README.md").write_text(
        f"# {name}\n\nRewards 1.0 when the reply's last `\\boxed{{}}` holds the row's `expected_answer` "
        f"(case-insensitive), else 0.0.\n\nRow fields: `expected_answer`. Prove it: `gymbus check {name}`.\n"
    )
    test = ENV_TEST.replace("__NAME__", name).replace("__REF__", _ref(name, root, "env", "ENVIRONMENT"))
    (folder / "tests" / f"test_{name}.py").write_text(test)
    return folder


def write_agent(name: str, root: Path) -> Path:
    """functions/NAME/ with a tool-loop agent, README, requirements and a test."""
    folder = _folder(name, root)
    (folder / "__init__.py").write_text(f'from {_package(name, root)}.agent import AGENT\n\n__all__ = ["AGENT"]\n')
    (folder / "agent.py").write_text(AGENT.replace("__NAME__", name))
    (folder / "requirements.txt").write_text("")
    (folder / "README.md").write_text(
        f"# {name}\n\nA tool loop: the model's tool calls go to the environment until it answers in text "
        f"(or `max_steps`).\nServe it: `gymbus worker {name} --nats URL`.\n"
    )
    test = AGENT_TEST.replace("__NAME__", name).replace("__REF__", _ref(name, root, "agent", "AGENT"))
    (folder / "tests" / f"test_{name}.py").write_text(test)
    return folder
