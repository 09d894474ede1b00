"""``gymbus tasks``: task rows written from other ecosystems' environments (their bridges in functions/)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import typer

from runtime.cli.common import console
from runtime.errors import InputError

tasks_app = typer.Typer(
    help="Write NeMo Gym-shaped task rows from other ecosystems' environments.", no_args_is_help=True
)


def reasoning_gym(
    spec: Annotated[
        Path | None, typer.Argument(help="Dataset spec (YAML or JSON): generators, sizes, seeds, difficulty.")
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Task JSONL to write.")] = None,
    generator: Annotated[
        list[str] | None, typer.Option("--generator", "-g", help="A generator (repeatable), when no SPEC is given.")
    ] = None,
    size: Annotated[int, typer.Option("--size", min=1, help="Tasks per generator (without SPEC).")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of every generator (without SPEC).")] = 0,
    list_: Annotated[bool, typer.Option("--list", help="List the installed generators and exit.")] = False,
) -> None:
    """Generate reasoning-gym tasks offline into rows for the `reasoning_gym` environment (no network)."""
    _require("reasoning_gym", "reasoning-gym", "reasoning_gym")
    from functions.reasoning_gym import generate

    if list_:
        console.print(" ".join(generate.generators()))
        return
    if spec is not None and generator:
        raise InputError("give either SPEC or --generator, not both")
    if spec is not None:
        dataset = generate.load_spec(spec)
    elif generator:
        dataset = generate.DatasetSpec(generators=list(generator), size=size, seed=seed)
    else:
        raise InputError("name the generators: a SPEC file, or --generator NAME (see --list)")
    _write(_need(output), generate.rows(dataset), lambda r: r["generator"]["name"])


def verifiers(
    taskset: Annotated[str, typer.Argument(help="A verifiers (v1) taskset package: its import name, installed here.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Task JSONL to write.")] = None,
    args: Annotated[str, typer.Option("--args", "-a", help="The taskset config's fields, as a JSON object.")] = "{}",
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="First N tasks only.")] = None,
) -> None:
    """Write a verifiers environment package's tasks as rows for the `verifiers_bridge` environment."""
    _require("verifiers", "verifiers", "verifiers")
    from functions.verifiers_bridge import tasksets
    from runtime.errors import InvalidInput

    try:
        fields = json.loads(args)
    except json.JSONDecodeError as exc:
        raise InputError(f"--args: not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise InputError(f"--args: expected a JSON object, got {type(fields).__name__}")
    try:
        _write(_need(output), tasksets.rows(taskset, fields, limit), lambda r: r["verifiers"]["taskset"])
    except InvalidInput as exc:
        raise InputError(exc.reason) from None


def _need(output: Path | None) -> Path:
    if output is None:
        raise InputError("--output/-o: name the task JSONL to write")
    return output


def _write(output: Path, rows: Iterable[dict[str, Any]], group: Callable[[dict[str, Any]], str]) -> None:
    """Write the rows (all of them, or none if one fails) and say how many per group."""
    counts: Counter[str] = Counter()
    lines = []
    for row in rows:
        counts[group(row)] += 1
        lines.append(json.dumps(row) + "\n")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(lines))
    console.print(f"wrote {sum(counts.values())} task rows of {len(counts)} group(s) to {output}")


def _require(module: str, package: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise InputError(f"this needs the {package!r} package, which is not installed: pip install -e '.[{extra}]'")


def register_tasks_commands(guarded: Callable[[Callable[..., None]], Callable[..., None]]) -> None:
    tasks_app.command("reasoning-gym")(guarded(reasoning_gym))
    tasks_app.command("verifiers")(guarded(verifiers))
