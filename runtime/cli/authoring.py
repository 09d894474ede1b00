"""Commands for environment and agent authors: check, new env, new agent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from runtime.cli.common import console, run

new_app = typer.Typer(help="Write a new function folder that passes `gymbus check` as written.", no_args_is_help=True)


def check(
    env: Annotated[str, typer.Argument(help="Environment: a name under functions/ or module:OBJECT.")],
    tasks: Annotated[
        Path | None, typer.Option("--tasks", "-t", help="Task JSONL (default: the environment's data/example.jsonl).")
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Run every task through this agent (default: the rows' own).")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for each pass's rollouts.")] = 120.0,
) -> None:
    """Prove an environment's verifier both ways on the real stack (exit 1 if it fails).

    Every example task runs through an embedded broker, real workers and the simulated policy playing
    the environment's reference: at accuracy 1 each task must earn the environment's maximum reward,
    at accuracy 0 its minimum; every rollout must end and none may fail. Prints a table per task.
    """
    from runtime.checking import check as run_check

    report = run(run_check(env, tasks, agent=agent, timeout_s=timeout))
    console.print(report_table(report))
    low, high = report.reward_range
    verdict = "[green]PASS[/]" if report.ok else "[red]FAIL[/]"
    failed = sum(not t.ok for t in report.tasks)
    console.print(
        f"check {report.env}: {verdict}  {len(report.tasks) - failed}/{len(report.tasks)} tasks earn {high:g} "
        f"at accuracy 1 and {low:g} at accuracy 0 ({report.seconds:.1f} s)"
    )
    if not report.ok:
        raise typer.Exit(1)


def report_table(report: Any) -> Table:
    table = Table(title=f"gymbus check {report.env} ({report.tasks_file})", title_justify="left", box=None)
    for col in ("task", "reward @1", "reward @0", "ok", "problem"):
        table.add_column(col, justify="right" if col.startswith(("task", "reward")) else "left", overflow="fold")
    for t in report.tasks:
        table.add_row(
            str(t.index),
            _reward(t.right),
            _reward(t.wrong),
            Text("yes", style="green") if t.ok else Text("NO", style="bold red"),
            "; ".join(t.problems),
        )
    return table


def _reward(result: Any) -> str:
    if result is None:
        return "-"
    return result.failure_kind if result.failed else f"{result.reward:g}"


def new_env(
    name: Annotated[str, typer.Argument(help="The environment's name (a folder under --root).")],
    root: Annotated[Path, typer.Option("--root", help="Where function folders live.")] = Path("functions"),
) -> None:
    """Write functions/NAME/: an exact-match environment with a reference, 8 example tasks, a README,
    requirements.txt and a test that runs `gymbus check NAME`."""
    from runtime.scaffold import write_env

    console.print(f"wrote {write_env(name, root)}: run `gymbus check {name}`")


def new_agent(
    name: Annotated[str, typer.Argument(help="The agent's name (a folder under --root).")],
    root: Annotated[Path, typer.Option("--root", help="Where function folders live.")] = Path("functions"),
) -> None:
    """Write functions/NAME/: a tool-loop agent, its README and a test that checks an environment with it."""
    from runtime.scaffold import write_agent

    console.print(f"wrote {write_agent(name, root)}: its test runs `gymbus check` through it")


def register_new_commands(guarded: Callable[[Callable[..., None]], Callable[..., None]]) -> None:
    new_app.command("env")(guarded(new_env))
    new_app.command("agent")(guarded(new_agent))
