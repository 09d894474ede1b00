"""The README's "Publishing from any language", run as written.

The `nats` CLI cannot be installed where gymbus is tested, so each `nats` command of the section is
parsed (only the flags natscli defines for it are accepted: `pub -H K:V --jetstream`, `sub --all
--count N`, `kv put BUCKET KEY VALUE`) and carried out with nats-py against a real broker and real
workers, as natscli would; the section's JSON examples are checked against `gymbus schema`.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import jsonschema

from broker import inspect, topology
from broker.wireschema import schema
from conftest import MATH_TASKS, ROOT
from runtime.testing import Harness


def section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Publishing from any language", 1)[1].split("\n## ", 1)[0]


def nats_commands() -> list[list[str]]:
    block = section().split("**The same flow with the `nats` CLI**", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip().startswith("nats ")]


def parse(args: list[str], flags: dict[str, bool]) -> tuple[list[str], dict[str, list[str]]]:
    """Positional arguments and flags (a flag in ``flags`` takes a value when its entry is True)."""
    positional, seen, it = [], dict[str, list[str]](), iter(args)
    for arg in it:
        if arg.startswith("-"):
            assert arg in flags, f"{arg} is not a flag of this nats command"
            seen.setdefault(arg, []).append(next(it) if flags[arg] else "")
        else:
            positional.append(arg)
    return positional, seen


async def run(h: Harness, args: list[str]) -> Any:
    match args:
        case ["nats", "kv", "put", bucket, key, value]:
            await (await h.js.key_value(bucket)).put(key, value.encode())
        case ["nats", "pub", *rest]:
            (subject, body), flags = parse(rest, {"-H": True, "--jetstream": False})
            assert "--jetstream" in flags
            headers = dict(h.split(":", 1) for h in flags.get("-H", []))
            return await h.js.publish(
                subject, body.encode(), headers={k.strip(): v.strip() for k, v in headers.items()}
            )
        case ["nats", "sub", *rest]:
            [subject], flags = parse(rest, {"--all": False, "--count": True})
            assert "--all" in flags
            stream = topology.RESULTS_STREAM if subject.startswith("gym.result.") else topology.DEAD_STREAM
            count = int(flags["--count"][0]) if "--count" in flags else None
            if count:
                await h.results(subject.removeprefix("gym.result."), count)
            return [m async for m in inspect.messages(h.js, stream, subject)]
        case _:
            raise AssertionError(f"not a command the README should show: {args}")


async def test_the_nats_cli_flow_runs_as_written(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    commands = nats_commands()
    assert [c[:2] for c in commands] == [["nats", "kv"], ["nats", "pub"], ["nats", "sub"], ["nats", "sub"]]
    manifest = json.loads(commands[0][5])
    jsonschema.Draft202012Validator(schema("manifest")).validate(manifest)
    await run(harness, commands[0])
    ack = await run(harness, commands[1])
    assert not ack.duplicate and (await run(harness, commands[1])).duplicate  # published twice: stored once
    [stored] = await run(harness, commands[2])
    result = json.loads(stored.data)
    assert result["reward"] == 1.0 and result["failure_kind"] is None
    assert result["sampling"]["temperature"] == manifest["defaults"]["sampling"]["temperature"]
    assert result["output"][0]["type"] == "function_call"  # the environment's tools, offered by the workers
    pub_headers = dict(h.split(":", 1) for h in parse(commands[1][2:], {"-H": True, "--jetstream": False})[1]["-H"])
    assert stored.headers["traceparent"] == pub_headers["traceparent"]
    assert await run(harness, commands[3]) == []  # nothing was rejected


def test_the_sections_json_examples_follow_the_schema() -> None:
    text = section()
    block = text.split("```json", 1)[1].split("```", 1)[0]
    jsonschema.Draft202012Validator(schema("manifest")).validate(json.loads(block))
    start = json.loads(nats_commands()[1][3])
    jsonschema.Draft202012Validator(schema("start")).validate(start)
