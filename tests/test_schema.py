"""`gymbus schema`: JSON Schema from the msgspec types that other languages can validate tasks against."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import msgspec
import pytest
from typer.testing import CliRunner

from broker.schemas import Result, Start, agent_decoder, encoder, wire_decoder
from conftest import MATH_TASKS, ROOT
from runtime.cli import app
from runtime.runs.config import RunConfig
from runtime.runs.tasks import build_start, read_tasks

runner = CliRunner()


def cli_schema(kind: str | None = None) -> jsonschema.Draft202012Validator:
    result = runner.invoke(app, ["schema", *([kind] if kind else [])])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def real_start() -> dict[str, Any]:
    """A Start exactly as `gymbus collect`/`submit` publish it, for the first example task."""
    cfg = RunConfig(input=str(MATH_TASKS), agent="simple_agent", env="math", sampling={"temperature": 0.7})
    start = build_start(cfg, "run-1", read_tasks(MATH_TASKS, limit=1)[0], 2, 0, tool_specs=None)
    return json.loads(encoder.encode(start))


def readme_start() -> dict[str, Any]:
    """The task published with `nats pub` in the README."""
    text = (ROOT / "README.md").read_text()
    payload = text.split("nats pub gym.agent.simple_agent '", 1)[1].split("'", 1)[0]
    return json.loads(payload)


@pytest.mark.parametrize("make", [real_start, readme_start])
def test_start_schema_accepts_real_tasks(make: Any) -> None:
    message = make()
    cli_schema("start").validate(message)
    cli_schema().validate(message)  # the union of all wire messages
    assert isinstance(agent_decoder.decode(json.dumps(message)), Start)  # and the workers agree


@pytest.mark.parametrize(
    "change,where",
    [
        ({"run_id": None}, "run_id"),  # removed below: a required field is missing
        ({"task_index": -1}, "task_index"),
        ({"run_id": "has space"}, "run_id"),
        ({"kind": "begin"}, "kind"),
        ({"responses_create_params": "What is 6*7?"}, "responses_create_params"),
        ({"options": {"max_steps": 0}}, "max_steps"),
    ],
)
def test_start_schema_rejects_malformed_tasks(change: dict[str, Any], where: str) -> None:
    message = {**real_start(), **change}
    message = {k: v for k, v in message.items() if v is not None}
    errors = list(cli_schema("start").iter_errors(message))
    assert errors and any(where in json.dumps([*e.absolute_path, e.message]) for e in errors)
    assert not cli_schema().is_valid(message)
    with pytest.raises(msgspec.ValidationError):  # the schema rejects exactly what the workers reject
        agent_decoder.decode(json.dumps(message))


def test_schema_covers_every_wire_message_with_field_docs() -> None:
    validator = cli_schema()
    result = Result(session_id="r.0.0", run_id="r", task_index=0, reward=1.0, verifier={"extracted_answer": "4"})
    validator.validate(json.loads(encoder.encode(result)))
    assert isinstance(wire_decoder.decode(encoder.encode(result)), Result)
    start = validator.schema["$defs"]["Start"]["properties"]
    assert all(prop.get("description") for prop in start.values())
    assert "gym.result.<run_id>" in start["run_id"]["description"]


def test_schema_unknown_kind_names_the_choices() -> None:
    result = runner.invoke(app, ["schema", "task"])
    assert result.exit_code == 2
    assert "unknown message kind 'task'" in result.output and "start" in result.output
