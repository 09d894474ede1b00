"""A valid instance of a JSON Schema (the reference answer), and a wrong one, for the schemas rows use."""

from __future__ import annotations

from typing import Any

_SAMPLE = {"string": "sample", "integer": 1, "number": 1.5, "boolean": True, "null": None}
_WRONG = {"string": 7, "integer": "seven", "number": "seven", "boolean": "yes", "null": 0, "array": {}, "object": []}


def instance(schema: dict[str, Any]) -> Any:
    """A value valid against ``schema`` (objects, arrays, scalars, enum, const, anyOf/oneOf, bounds)."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return instance(schema[key][0])
    kind = schema.get("type", "object" if "properties" in schema else "string")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties", {})
        return {name: instance(sub) for name, sub in props.items()}
    if kind == "array":
        return [instance(schema.get("items", {})) for _ in range(max(1, schema.get("minItems", 1)))]
    if kind == "string":
        text = {"date": "2026-01-02", "date-time": "2026-01-02T03:04:05Z", "email": "a@example.com"}.get(
            schema.get("format", ""), "sample"
        )
        return text + "x" * max(0, schema.get("minLength", 0) - len(text))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + (1 if "exclusiveMinimum" in schema else 0))
        return int(low) if kind == "integer" else float(low) + 0.5 * ("exclusiveMinimum" in schema)
    return _SAMPLE.get(kind)


def wrong_instance(schema: dict[str, Any]) -> Any:
    """A value every top-level field of which breaks ``schema`` (the plausible wrong answer)."""
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if kind == "object" and schema.get("properties"):
        return {name: _wrong(sub) for name, sub in schema["properties"].items()}
    return _wrong(schema)


def _wrong(schema: dict[str, Any]) -> Any:
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list) or kind is None:
        return {"__wrong__": True} if schema.get("enum") is None else "__not_an_option__"
    return "__not_an_option__" if schema.get("enum") and kind == "string" else _WRONG.get(kind, [])
