"""A small agent harness, as any existing one would be: it speaks the OpenAI Chat Completions API with
tools, runs its own tools, and knows nothing of gymbus.

It reads its task from GYMBUS_TASK (a JSON file with the task's chat ``messages``), or takes the
prompt from its command line, and talks to OPENAI_BASE_URL with OPENAI_API_KEY as the bearer token
and OPENAI_MODEL as the model. It offers two tools of its own, a calculator and a scratchpad
(``note``, which it writes to notes.txt in its working directory), runs the calls the model makes,
sends their results back, and stops when the model answers without a call (or after MAX_TURNS),
printing that answer. Only the Python standard library is used.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

MAX_TURNS = 12
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression such as (3 + 4) * 12 / 7.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "note",
            "description": "Write a line to your scratchpad (notes.txt).",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    },
]
_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression (numbers and + - * / // % ** only)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return "error: arguments are not JSON"
    if name == "calculator":
        return calculate(str(args.get("expression", "")))
    if name == "note":
        with open("notes.txt", "a") as fh:
            fh.write(f"{args.get('text', '')}\n")
        return "noted"
    return f"error: no tool {name!r}"


def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": os.environ.get("OPENAI_MODEL", "policy"), "messages": messages, "tools": TOOLS}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}"},
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        return json.load(resp)["choices"][0]["message"]


def task_messages() -> list[dict[str, Any]]:
    if len(sys.argv) > 1:
        return [{"role": "user", "content": " ".join(sys.argv[1:])}]
    with open(os.environ["GYMBUS_TASK"]) as fh:
        return list(json.load(fh)["messages"])


def main() -> int:
    messages = task_messages()
    for _ in range(MAX_TURNS):
        try:
            message = chat(messages)
        except urllib.error.HTTPError as exc:
            print(f"model call failed: HTTP {exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
            return 1
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        calls = message.get("tool_calls") or []
        if not calls:
            print(message.get("content") or "")
            return 0
        for call in calls:
            fn = call["function"]
            result = run_tool(fn["name"], fn["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    print("gave up after", MAX_TURNS, "turns", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
