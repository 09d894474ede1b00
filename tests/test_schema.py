"""`gymbus schema`: JSON Schema from the msgspec types that other languages can validate tasks against."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import msgspec
import pytest
from typer.testing import CliRunner

from broker.schemas import Result, Start, agent_decoder, encoder, wire_decoder
from broker.wireschema import KINDS, start_for
from conftest import MATH_TASKS, ROOT
from runtime.cli import app
from runtime.engine.records import input_items
from runtime.errors import InvalidInput
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
    cfg = RunConfig(input=str(MATH_TASKS), agent="simple_agent", env="math")
    start = build_start(cfg, "run-1", read_tasks(MATH_TASKS, limit=1)[0], 2, 0)
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


VOCABULARY_2020_12 = {
    *("$schema", "$id", "$ref", "$defs", "$comment", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary"),
    *("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "prefixItems", "items"),
    *("contains", "properties", "patternProperties", "additionalProperties", "propertyNames"),
    *("unevaluatedItems", "unevaluatedProperties", "type", "enum", "const", "multipleOf", "maximum"),
    *("exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems"),
    *("minItems", "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required"),
    *("dependentRequired", "title", "description", "default", "deprecated", "readOnly", "writeOnly"),
    *("examples", "format", "contentEncoding", "contentMediaType", "contentSchema"),
}
_SCHEMA_MAPS = ("$defs", "properties", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("not", "if", "then", "else", "items", "contains", "additionalProperties", "propertyNames")


def unknown_keywords(node: Any, path: str = "#") -> list[str]:
    """Keywords that are not JSON Schema 2020-12's, by where they occur (what a strict validator rejects)."""
    if not isinstance(node, dict):
        return []
    out = [f"{path}/{k}" for k in node if k not in VOCABULARY_2020_12]
    for k in _SCHEMA_MAPS:
        for name, sub in node.get(k, {}).items():
            out += unknown_keywords(sub, f"{path}/{k}/{name}")
    for k in _SCHEMA_LISTS:
        for n, sub in enumerate(node.get(k, [])):
            out += unknown_keywords(sub, f"{path}/{k}/{n}")
    for k in _SCHEMA_ONE:
        out += unknown_keywords(node.get(k), f"{path}/{k}")
    return out


@pytest.mark.parametrize("kind", [*KINDS, "start --env math"])
def test_every_schema_is_plain_json_schema_2020_12(kind: str) -> None:
    result = runner.invoke(app, ["schema", *kind.split()])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert unknown_keywords(schema) == []  # no OpenAPI `discriminator`: Ajv's strict mode would refuse it
    assert unknown_keywords({"anyOf": [{"discriminator": {}}]}) == ["#/anyOf/0/discriminator"]


def test_schema_all_holds_every_document_a_producer_or_consumer_reads() -> None:
    defs = cli_schema().schema["$defs"]
    assert {"Start", "Result", "DeadLetter", "Manifest", "Registration", "CreateParams"} <= set(defs)
    for written_whole in ("Result", "Usage", "Timings", "DeadLetter"):
        assert defs[written_whole]["required"] == list(defs[written_whole]["properties"])


@pytest.mark.parametrize(
    "change,where",
    [
        ({"options": {"max_step": 3}}, "max_step"),
        ({"responses_create_params": {"input": "6*7?", "temprature": 0.5}}, "temprature"),
        ({"responses_create_params": {"input": "6*7?", "stream": True}}, "stream"),
        ({"responses_create_params": {"input": "6*7?", "temperature": "hot"}}, "temperature"),
        ({"expected_answer": "42"}, "expected_answer"),
    ],
)
def test_start_schema_and_workers_reject_the_same_typos(change: dict[str, Any], where: str) -> None:
    message = {**real_start(), **change}
    assert not cli_schema("start").is_valid(message)
    with pytest.raises((msgspec.ValidationError, InvalidInput), match=where):  # as the agent worker does
        input_items(agent_decoder.decode(json.dumps(message)).responses_create_params)


def test_start_schema_of_an_environment_requires_its_task_fields() -> None:
    result = runner.invoke(app, ["schema", "start", "--env", "math"])
    assert result.exit_code == 0, result.output
    validator = jsonschema.Draft202012Validator(json.loads(result.stdout))
    validator.validate(real_start())
    no_answer = {**real_start(), "meta": {}}
    [error] = validator.iter_errors(no_answer)
    assert list(error.absolute_path) == ["meta"] and "expected_answer" in error.message
    assert not validator.is_valid({**real_start(), "env": "other"})
    tools = validator.schema["$defs"]["CreateParams"]["properties"]["tools"]
    assert [t["name"] for t in tools["default"]] == ["calculator"]


def test_schema_env_needs_start() -> None:
    result = runner.invoke(app, ["schema", "result", "--env", "math"])
    assert result.exit_code == 2 and "--env narrows the start message" in result.output


def environments() -> list[str]:
    """Every function folder with an env module (agents' folders carry example tasks too)."""
    return sorted(p.parent.name for p in (ROOT / "functions").glob("*/env.py") if (p.parent / "data").is_dir())


@pytest.mark.parametrize("name", environments())
def test_every_environments_start_schema_is_strict_and_agrees_with_the_environment(name: str) -> None:
    """`gymbus schema start --env` for each environment: plain 2020-12, and its task fields' schema
    accepts and refuses the same example rows as the environment itself (msgspec, at its workers)."""
    from runtime.engine.registry import registration_of
    from runtime.sdk import Environment, load

    env = load(name)
    assert isinstance(env, Environment)
    registration = registration_of(env)
    schema = start_for(registration)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert unknown_keywords(schema) == []
    validator = jsonschema.Draft202012Validator(registration.meta_schema or {})
    for line in (ROOT / "functions" / name / "data" / "example.jsonl").read_text().splitlines():
        meta = {k: v for k, v in json.loads(line).items() if k != "responses_create_params"}
        try:
            env.check_meta(meta)
            accepted = True
        except InvalidInput:
            accepted = False
        assert validator.is_valid(meta) == accepted, meta
