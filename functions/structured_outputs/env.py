"""structured_outputs: the reply validated against the row's JSON Schema, with partial credit by field.

The reply is the text of the model's answer (``response_mode: text``; JSON, YAML or TOML by
``schema_type``, a surrounding code fence ignored), or the arguments of its one call to the row's
``tool_name`` (``response_mode: tool_call``; under ``tool_payload_key`` when the row names one).
It is validated with ``jsonschema``. The reward is 1.0 when valid; else, with partial credit, the
share of the schema's top-level fields that are present (when required) and valid, each field not in
the schema counted against it; 0.0 for a reply that does not parse. The validation errors are in
the verifier info. Rows of NeMo Gym's ``structured_outputs`` resources server (``schema_str``)
run unchanged: their schema is made strict (every property required, no others) and scored
all-or-nothing, as there, unless the row says ``partial_credit: true``.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any, Literal

import jsonschema
import msgspec
import yaml

from functions.structured_outputs.schemas import instance, wrong_instance
from runtime.sdk import Call, Environment, Reference, Rollout, Task, Verdict

_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n(.*?)\n\s*```\s*$", re.S)


class Meta(msgspec.Struct, frozen=True):
    schema: dict[str, Any] | None = None
    schema_str: str | None = None
    schema_type: Literal["json", "yaml", "toml"] = "json"
    response_mode: Literal["text", "tool_call"] = "text"
    tool_name: str | None = None
    tool_payload_key: str | None = None
    partial_credit: bool | None = None

    def __post_init__(self) -> None:
        if (self.schema is None) == (self.schema_str is None):
            raise ValueError("give exactly one of `schema` (an object) and `schema_str` (its JSON text)")
        if self.schema_str is not None:
            try:
                json.loads(self.schema_str)
            except json.JSONDecodeError as exc:
                raise ValueError(f"`schema_str` is not valid JSON: {exc}") from None
        try:
            jsonschema.Draft202012Validator.check_schema(self.json_schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"the schema is not a valid JSON Schema: {exc.message}") from None

    @property
    def json_schema(self) -> dict[str, Any]:
        return self.schema if self.schema is not None else _strict(json.loads(self.schema_str or "{}"))


def _strict(schema: Any) -> Any:
    """NeMo Gym's reading of a schema: every object's properties required, and no others."""
    if isinstance(schema, dict):
        if isinstance(schema.get("properties"), dict):
            schema.setdefault("required", list(schema["properties"]))
            schema.setdefault("additionalProperties", False)
        for value in schema.values():
            _strict(value)
    elif isinstance(schema, list):
        for value in schema:
            _strict(value)
    return schema


def _payload(meta: Meta, rollout: Rollout) -> tuple[Any, str | None]:
    if meta.response_mode == "tool_call":
        calls = [i for i in rollout.output if i.get("type") == "function_call"]
        if len(calls) != 1:
            return None, f"expected exactly one tool call, got {len(calls)}"
        if meta.tool_name and calls[0].get("name") != meta.tool_name:
            return None, f"expected a call to {meta.tool_name!r}, got {calls[0].get('name')!r}"
        try:
            args = json.loads(calls[0].get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            return None, f"the call's arguments are not valid JSON: {exc}"
        if meta.tool_payload_key:
            if not isinstance(args, dict) or meta.tool_payload_key not in args:
                return None, f"the call's arguments have no {meta.tool_payload_key!r}"
            return args[meta.tool_payload_key], None
        return args, None
    text = rollout.text
    fenced = _FENCE.match(text)
    text = fenced.group(1) if fenced else text
    try:
        return {"json": json.loads, "yaml": yaml.safe_load, "toml": tomllib.loads}[meta.schema_type](text), None
    except Exception as exc:  # the model's text is data: any parse failure is a wrong answer
        return None, f"the reply is not valid {meta.schema_type}: {type(exc).__name__}: {str(exc)[:200]}"


def score(schema: dict[str, Any], value: Any, partial: bool) -> tuple[float, list[str]]:
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    messages = [f"{'/'.join(map(str, e.path)) or '$'}: {e.message}"[:300] for e in errors]
    if not errors:
        return 1.0, []
    fields = list(schema.get("properties") or {})
    if not partial or not fields or not isinstance(value, dict):
        return 0.0, messages
    bad = {str(e.path[0]) for e in errors if e.path}
    for e in errors:
        if not e.path and e.validator == "required":
            bad |= {f for f in schema.get("required", []) if f not in value}
    extra = [k for k in value if k not in fields] if schema.get("additionalProperties") is False else []
    good = [f for f in fields if f not in bad and (f in value or f not in schema.get("required", []))]
    return len(good) / (len(fields) + len(extra)), messages


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 if the reply is valid, partial credit by field, 0.0 if it does not parse; errors in the info."""
    meta = task.meta
    value, why = _payload(meta, rollout)
    if why is not None:
        return Verdict(0.0, {"reason": why})
    partial = meta.partial_credit if meta.partial_credit is not None else meta.schema is not None
    reward, errors = score(meta.json_schema, value, partial)
    return Verdict(reward, {"errors": errors[:20], "n_errors": len(errors)})


def reference(task: Task[Meta]) -> Reference:
    meta = task.meta
    right, wrong = instance(meta.json_schema), wrong_instance(meta.json_schema)
    if meta.response_mode == "tool_call":
        name = meta.tool_name or "respond"
        wrap = (lambda v: {meta.tool_payload_key: v}) if meta.tool_payload_key else (lambda v: v)
        return Reference(right=[Call(name, wrap(right)), "Done."], wrong=[Call(name, wrap(wrong)), "Done."])
    dump = {"json": json.dumps, "yaml": yaml.safe_dump, "toml": _toml}[meta.schema_type]
    return Reference(right=dump(right), wrong=dump(wrong) if meta.schema_type == "json" else "{{not parseable")


def _toml(value: Any) -> str:
    return "\n".join(f"{k} = {json.dumps(v)}" for k, v in value.items())


ENVIRONMENT = Environment(
    name="structured_outputs",
    meta=Meta,
    verify=verify,
    reference=reference,
    agent="one_shot",
    accepts=["structured_outputs"],
)
