"""The JSON Schema of the wire messages, generated from the msgspec types (``gymbus schema``).

msgspec writes the schema from the types alone. Field docstrings are not kept by Python at run
time, so they are read from the source of `broker.schemas` and become each property's
``description``: a publisher in another language gets the same documentation as the Python code.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import msgspec

from broker import schemas

DIALECT = "https://json-schema.org/draft/2020-12/schema"

KINDS: dict[str, Any] = {
    "all": schemas.WireMsg,
    "start": schemas.Start,
    "resume": schemas.Resume,
    "seed": schemas.Seed,
    "tools": schemas.Tools,
    "verify": schemas.Verify,
    "result": schemas.Result,
    "dead-letter": schemas.DeadLetter,
    "manifest": schemas.Manifest,
}
"""What `schema` can describe: every wire message (a union tagged by ``kind``), or one of them."""


def schema(kind: str = "all") -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one message kind, or of all wire messages."""
    if kind not in KINDS:
        raise KeyError(f"unknown message kind {kind!r}; choose from {', '.join(KINDS)}")
    out = msgspec.json.schema(KINDS[kind])
    for name, definition in out.get("$defs", {}).items():
        _describe_fields(definition, getattr(schemas, name, None))
    title = "gymbus wire messages" if kind == "all" else f"gymbus {kind} message"
    return {"$schema": DIALECT, "title": title, **out}


def _describe_fields(definition: dict[str, Any], cls: type | None) -> None:
    if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
        return
    tag = definition.get("properties", {}).get(schemas.Msg.__struct_config__.tag_field or "")
    if tag is not None:
        tag["description"] = "The message kind, which selects its schema (and its handler)."
    for field, doc in field_docs(cls).items():
        prop = definition.get("properties", {}).get(field)
        if prop is not None:
            about_type = prop.get("description")
            prop["description"] = f"{doc} ({about_type})" if about_type else doc


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` for the fields of ``cls`` (and its bases) that have one."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ != schemas.__name__:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs
