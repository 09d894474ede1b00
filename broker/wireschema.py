"""The JSON Schema of the wire messages, generated from the msgspec types (``gymbus schema``).

msgspec writes the schema from the types alone. Field docstrings are not kept by Python at run
time, so they are read from the source of the classes and become each property's
``description``: a publisher in another language gets the same documentation as the Python code.

The output is plain JSON Schema 2020-12, strict enough for Ajv's strict mode: no OpenAPI
``discriminator`` (the ``kind`` of each message is a ``const``-like ``enum``), every property a
document written by gymbus always carries is ``required`` (a reader needs no defaults), and a Start's
``responses_create_params`` is described by `broker.params.CreateParams`. `start_for` narrows the
Start schema to one environment: its name, its task fields (``meta``) and its tools.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import textwrap
import threading
from typing import Any

import msgspec

from broker import functions, letters, manifests, params, schemas, training

DIALECT = "https://json-schema.org/draft/2020-12/schema"

WIRE: list[type] = [schemas.Start, schemas.Resume, schemas.Seed, schemas.Tools, schemas.Verify, schemas.Result]
"""Every message on a ``gym.agent|tool|verify|result`` subject, tagged by ``kind``."""
DOCUMENTS: list[type] = [*WIRE, letters.DeadLetter, manifests.Manifest, functions.Registration, params.CreateParams]
"""Everything `schema all` describes: the wire messages, then the dead letters (``gym.dead.<function>``),
the run manifest (KV ``runs``), a function's registration (KV ``functions``) and a Start's create body."""

KINDS: dict[str, type | None] = {
    "all": None,
    "start": schemas.Start,
    "resume": schemas.Resume,
    "seed": schemas.Seed,
    "tools": schemas.Tools,
    "verify": schemas.Verify,
    "result": schemas.Result,
    "dead-letter": letters.DeadLetter,
    "manifest": manifests.Manifest,
    "registration": functions.Registration,
    "create-params": params.CreateParams,
}
"""What `schema` can describe: every document (``all``: the wire messages' union, each type under
``$defs``), or one of them."""

WRITTEN_WHOLE: tuple[type, ...] = (
    schemas.Result,
    schemas.Usage,
    schemas.Timings,
    schemas.Turn,
    training.Trajectory,
    letters.DeadLetter,
    functions.Registration,
)
"""Documents gymbus writes with every field present: all their properties are required."""

_CLASSES: dict[str, type] = {
    name: obj
    for module in (schemas, params, functions, letters, training)
    for name, obj in vars(module).items()
    if isinstance(obj, type) and issubclass(obj, msgspec.Struct) and obj.__module__ == module.__name__
}


def schema(kind: str = "all") -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one document kind, or of all of them."""
    if kind not in KINDS:
        raise KeyError(f"unknown message kind {kind!r}; choose from {', '.join(KINDS)}")
    chosen = KINDS[kind]
    types = DOCUMENTS if chosen is None else [chosen, *([params.CreateParams] if chosen is schemas.Start else [])]
    refs, defs = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    for name, definition in defs.items():
        _describe_fields(definition, _CLASSES.get(name))
        if _CLASSES.get(name) in WRITTEN_WHOLE:
            definition["required"] = list(definition.get("properties", {}))
    if "Start" in defs:
        start_params = defs["Start"]["properties"]["responses_create_params"]
        defs["Start"]["properties"]["responses_create_params"] = {
            "$ref": "#/$defs/CreateParams",
            "description": start_params.get("description", ""),
        }
    _strip(defs)
    if chosen is None:
        root: dict[str, Any] = {
            "description": "Any gymbus wire message, by its `kind`; every document type is under `$defs`.",
            "anyOf": list(refs[: len(WIRE)]),
        }
        title = "gymbus wire messages"
    else:
        root, title = refs[0], f"gymbus {kind} message"
    return {"$schema": DIALECT, "title": title, **root, "$defs": defs}


def start_for(registration: functions.Registration) -> dict[str, Any]:
    """The Start schema of one environment: ``env`` is its name, ``meta`` its task fields' schema,
    and ``responses_create_params.tools`` defaults to its tools."""
    out = schema("start")
    defs = out["$defs"]
    start = defs["Start"]
    props = start["properties"]
    name = registration.name
    props["env"] = {"const": name, "description": props["env"].get("description", "")}
    if registration.meta_schema is not None:
        meta = _embed(registration.meta_schema, defs, prefix=f"{name}.")
        props["meta"] = {**meta, "description": props["meta"].get("description", "")}
        if _requires_fields(meta, defs):
            start["required"] = [*start.get("required", []), "meta"]
    tools = defs["CreateParams"]["properties"]["tools"]
    names = ", ".join(str(t.get("name")) for t in registration.tools) or "none"
    tools["description"] = f"{tools.get('description', '')} The tools of {name!r}: {names}."
    tools["default"] = registration.tools
    out["title"] = f"gymbus start message for environment {name!r}"
    return out


def _embed(sub: dict[str, Any], defs: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``sub`` (a self-contained schema) with its ``$defs`` moved into ``defs`` under ``prefix``."""
    sub = copy.deepcopy(sub)
    own = sub.pop("$defs", {})
    sub.pop("$schema", None)

    def rename(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                node["$ref"] = "#/$defs/" + prefix + ref.removeprefix("#/$defs/")
            for value in node.values():
                rename(value)
        elif isinstance(node, list):
            for value in node:
                rename(value)

    rename(sub)
    rename(own)
    defs.update({prefix + k: v for k, v in own.items()})
    return sub


def _requires_fields(node: dict[str, Any], defs: dict[str, Any]) -> bool:
    ref = node.get("$ref")
    if isinstance(ref, str):
        node = defs.get(ref.removeprefix("#/$defs/"), {})
    return bool(node.get("required"))


def _strip(node: Any) -> None:
    """Remove OpenAPI's ``discriminator``: not a JSON Schema keyword (Ajv's strict mode rejects it)."""
    if isinstance(node, dict):
        node.pop("discriminator", None)
        for value in node.values():
            _strip(value)
    elif isinstance(node, list):
        for value in node:
            _strip(value)


def _describe_fields(definition: dict[str, Any], cls: type | None) -> None:
    if cls is None:
        return
    tag = definition.get("properties", {}).get(schemas.Msg.__struct_config__.tag_field or "")
    if tag is not None and issubclass(cls, schemas.Msg):
        tag["description"] = "The message kind, which selects its schema (and its handler)."
    describe(definition, cls)


def describe(definition: dict[str, Any], cls: type) -> None:
    """Set each property's ``description`` of a struct's schema from the field's docstring."""
    for field, doc in field_docs(cls).items():
        prop = definition.get("properties", {}).get(field)
        if prop is not None:
            about_type = prop.get("description")
            prop["description"] = f"{doc} ({about_type})" if about_type else doc


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` for the fields of ``cls`` (and its bases) that have one."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, msgspec.Struct) or klass.__module__.startswith("msgspec"):
            continue
        body = _class_def(klass)
        if body is None:
            continue
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


_PARSING = threading.Lock()


@functools.cache
def _class_def(klass: type) -> ast.ClassDef | None:
    """The class statement of ``klass``, parsed from its source once (None without source: a class
    made at run time). CPython 3.11's parser keeps its recursion depth in shared state, so a parse
    while another thread parses can fail with SystemError "AST constructor recursion depth
    mismatch": ours run one at a time, and one spoiled by a foreign thread is parsed again."""
    for attempt in range(3):
        try:
            with _PARSING:
                body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        except (OSError, TypeError, SyntaxError):
            return None
        except SystemError:
            if attempt == 2:
                raise
            continue
        return body if isinstance(body, ast.ClassDef) else None
    return None
