"""Misuse is input: each mistake a user can make on the command line ends as one line naming it (the
field or flag, the value, the fix) and a non-zero exit, never a traceback, and leaves nothing behind.

The README's troubleshooting table ("what you did" -> "what gymbus says") is checked against the
messages these commands really print: every row of it must be one of the misuses below, and its
message must be what gymbus says (``…`` stands for what varies: paths, ports).
"""

from __future__ import annotations

import html
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import MATH_TASKS, ROOT


@dataclass(frozen=True)
class Misuse:
    did: str
    """What the user did, as the README's table says it."""
    args: tuple[str, ...]
    says: str
    """What gymbus says (a fragment of its one line; ``…`` for what varies)."""
    code: int = 2


MISUSES = [
    Misuse("gave a flag a value out of range", ("collect", "{cfg}", "-r", "0"), "--repeats 0: Expected `int` >= 1"),
    Misuse(
        "made a typo in a config key",
        ("collect", "{typo}"),
        "…typo.yaml: Object contains unknown field `repeat`",
    ),
    Misuse(
        "named a config file that does not exist", ("collect", "nope.yaml"), "config file 'nope.yaml' does not exist"
    ),
    Misuse(
        "gave a run id with a character a subject cannot hold",
        ("collect", "{cfg}", "--run-id", "réunion"),
        "--run-id: run id 'réunion' is not a valid name: use 1-64 ASCII letters, digits, '-' or '_'",
    ),
    Misuse(
        "named an input file that does not exist",
        ("collect", "{cfg}", "--input", "nope.jsonl"),
        "input file 'nope.jsonl' does not exist (input: in the config, or --input)",
    ),
    Misuse("gave an empty input file", ("collect", "{cfg}", "--input", "{empty}"), "…empty.jsonl' holds no task rows"),
    Misuse(
        "named an agent that does not exist",
        ("collect", "{noagent}"),
        "agent 'nosuch': function 'nosuch': no module 'functions.nosuch'",
    ),
    Misuse(
        "pointed at a broker address where none listens",
        ("collect", "{cfg}", "--nats", "nats://127.0.0.1:1"),
        "no NATS broker answers at nats://127.0.0.1:1 (connection refused) after 1 s: start one, or check --nats",
    ),
    Misuse(
        "started a worker with a broker address where none listens",
        ("worker", "math", "--nats", "nats://127.0.0.1:1"),
        "no NATS broker answers at nats://127.0.0.1:1 (connection refused)",
    ),
    Misuse(
        "started a worker for a function that does not exist",
        ("worker", "nosuch", "--nats", "nats://127.0.0.1:1"),
        "FUNCTION 'nosuch': function 'nosuch': no module 'functions.nosuch'",
    ),
    Misuse(
        "pointed at a model URL where nothing listens",
        ("collect", "{cfg}", "--model-url", "http://127.0.0.1:1/v1"),
        "model endpoint http://127.0.0.1:1/v1 does not answer: … --no-check skips this check)",
    ),
    Misuse(
        "pointed at a model URL that is not an OpenAI-compatible server",
        ("collect", "{cfg}", "--model-url", "{web}"),
        "model endpoint … answered HTTP 404, not an OpenAI-compatible model list (a base URL usually ends in /v1)",
    ),
    Misuse(
        "replayed a dead letter that does not exist",
        ("replay", "99", "--config", "{cfg}", "--run", "never-ran"),
        "no dead letter 99 in run 'never-ran' (its dead letters: none)",
    ),
    Misuse(
        "listed dead letters without saying where",
        ("dead-letters",),
        "no broker: give --nats URL or --run-dir runs/<run_id>",
    ),
    Misuse("asked for a schema that does not exist", ("schema", "nosuch"), "unknown message kind 'nosuch'"),
    Misuse(
        "ran an agent on an environment it does not fit",
        ("collect", "{unfit}"),
        "agent 'step_agent' does not fit environment 'math': it has no steps (…); use simple_agent there",
    ),
    Misuse(
        "named a model for an agent that the run does not have",
        ("collect", "{nomodel}"),
        "agent 'tool_simulation_agent' does not fit model 'nosuch' (tool simulator): no model of that name in this "
        "run (it has: policy, tool_sim); add it under `models:` in the run config, or name one of those",
    ),
    Misuse(
        "gave an agent an option it does not take",
        ("collect", "{agentopt}"),
        "agent 'refinement_agent': Object contains unknown field `max_correction` - at `$.agent_options` "
        "(agent_options in the run config)",
    ),
]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A working directory with configs for the misuses, and a plain web server (not a model server)."""
    d = tmp_path_factory.mktemp("misuse")
    base = {"input": str(MATH_TASKS), "agent": "simple_agent", "env": "math", "limit": 2, "output": str(d / "runs")}
    (d / "run.yaml").write_text(json.dumps(base))
    (d / "typo.yaml").write_text(json.dumps({**base, "repeat": 3}))
    (d / "noagent.yaml").write_text(json.dumps({**base, "agent": "nosuch"}))
    (d / "empty.jsonl").write_text("\n")
    (d / "unfit.yaml").write_text(json.dumps({**base, "agent": "step_agent"}))
    tool_sim = {"agent": "tool_simulation_agent", "agent_options": {"simulator": "nosuch"}}
    (d / "nomodel.yaml").write_text(json.dumps({**base, **tool_sim}))
    typo = {"agent": "refinement_agent", "agent_options": {"max_correction": 1}}
    (d / "agentopt.yaml").write_text(json.dumps({**base, **typo}))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {
        "cfg": str(d / "run.yaml"),
        "typo": str(d / "typo.yaml"),
        "noagent": str(d / "noagent.yaml"),
        "empty": str(d / "empty.jsonl"),
        "unfit": str(d / "unfit.yaml"),
        "nomodel": str(d / "nomodel.yaml"),
        "agentopt": str(d / "agentopt.yaml"),
        "web": f"http://127.0.0.1:{server.server_address[1]}/v1",
        "dir": str(d),
    }
    server.shutdown()


def gymbus(args: tuple[str, ...], place: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GYMBUS_CONNECT_TIMEOUT_S": "1", "COLUMNS": "400"}
    env.pop("GYMBUS_NATS_URL", None)
    argv = [a.format(**place) for a in args]
    return subprocess.run(
        [sys.executable, "-m", "runtime", *argv], capture_output=True, text=True, timeout=120, cwd=place["dir"], env=env
    )


def matches(says: str, line: str) -> bool:
    """Whether ``line`` holds the pieces of ``says`` in order (``…`` stands for anything)."""
    pattern = ".*".join(re.escape(piece.strip()) for piece in says.split("…") if piece.strip())
    return re.search(pattern, line) is not None


@pytest.mark.parametrize("misuse", MISUSES, ids=[m.did for m in MISUSES])
def test_a_misuse_gets_one_line_naming_it(misuse: Misuse, place: dict[str, str]) -> None:
    done = gymbus(misuse.args, place)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == misuse.code, done.stderr
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and matches(misuse.says, lines[0]), lines[0]
    assert not (Path(place["dir"]) / "runs").exists() or not any((Path(place["dir"]) / "runs").iterdir())


def test_verbose_shows_the_traceback(place: dict[str, str]) -> None:
    done = gymbus(("collect", "{noagent}", "--verbose"), place)
    assert done.returncode == 2 and "Traceback" in done.stderr and "error: agent 'nosuch'" in done.stderr


def readme_table() -> list[tuple[str, str]]:
    """The rows of the README's troubleshooting table: (what you did, what gymbus says)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### What you did, and what gymbus says", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| what you did")]
    out = []
    for row in rows:
        did, says = (c.strip() for c in row.strip("|").split("|", 1)[:2])
        if not set(did) <= {"-", " "}:
            out.append((did, html.unescape(says)))
    return out


def test_the_readme_table_says_what_gymbus_says() -> None:
    table = readme_table()
    by_did = {m.did: m for m in MISUSES}
    assert [did for did, _ in table] == [m.did for m in MISUSES]
    for did, says in table:
        assert says == by_did[did].says, did
