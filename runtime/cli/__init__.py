"""The ``gymbus`` command line: one module per command group, registered here in one list.

    run.py       collect, submit, replay                          (rollouts)
    serve.py     worker, simulate, profiler, janitor, model serve, init
    inspect.py   status, profile, traces, dead-letters, schema
    authoring.py check, new env, new agent                        (environment and agent authors)
    tasks.py     tasks reasoning-gym, tasks verifiers             (rows from other ecosystems)
    runtime.bench  bench

`main` is the one error boundary: a user's mistake (`runtime.errors.UsageError`, an invalid name, an
unreachable broker) prints one line and exits 2; anything else is a gymbus bug, printed as one line
too (exit 1). ``--verbose`` (or GYMBUS_VERBOSE=1) shows the traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import typer
from rich.markup import escape

from broker.connect import BrokerUnavailable
from broker.denials import PermissionDenied
from broker.names import InvalidName
from broker.server import BrokerError
from broker.topology import InvalidLimit
from runtime.cli import auth, authoring, inspect, run, serve, tasks, train
from runtime.cli.common import err
from runtime.errors import UsageError

app = typer.Typer(
    name="gymbus",
    help=(
        "Run RLVR rollouts as stateless functions on NATS JetStream.\n\n"
        "Start with `gymbus collect configs/quickstart.yaml`: it starts an embedded broker, the workers "
        "and (unless a model URL is configured) a simulated policy, runs every task x repeat, and writes "
        "runs/<run_id>/. Re-running with the same --run-id resumes.\n\n"
        "Exit codes: 0 done, 1 every rollout failed (or a gymbus bug), 2 a usage error, 130 interrupted."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMANDS: list[tuple[Callable[..., None], str]] = [
    (run.collect, "collect"),
    (run.submit, "submit"),
    (run.replay, "replay"),
    (train.reverify, "reverify"),
    (serve.worker, "worker"),
    (serve.simulate, "simulate"),
    (serve.profiler, "profiler"),
    (serve.janitor, "janitor"),
    (serve.init, "init"),
    (inspect.status, "status"),
    (inspect.profile, "profile"),
    (inspect.traces, "traces"),
    (inspect.dead_letters, "dead-letters"),
    (inspect.schema, "schema"),
    (authoring.check, "check"),
]
USER_MISTAKES = (UsageError, InvalidName, InvalidLimit, BrokerUnavailable, BrokerError, PermissionDenied)
"""What the user can fix (a denial: an identity used for a job it is not allowed): one line, exit 2."""


def guarded(command: Callable[..., None]) -> Callable[..., None]:
    """The command, with a user's mistake turned into one line and exit code 2."""

    @functools.wraps(command)
    def run_command(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except USER_MISTAKES as exc:
            _error(str(exc), 2)

    return run_command


for command, name in COMMANDS:
    app.command(name)(guarded(command))
serve.register_model_commands(guarded)
app.add_typer(serve.model_app, name="model")
app.add_typer(auth.app, name="auth")
authoring.register_new_commands(guarded)
app.add_typer(authoring.new_app, name="new")
tasks.register_tasks_commands(guarded)
app.add_typer(tasks.tasks_app, name="tasks")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def bench(ctx: typer.Context) -> None:
    """Measure gymbus's own overhead on the real stack with the simulated policy (`gymbus bench --help`)."""
    from runtime.bench.cli import main as bench_main

    bench_main(ctx.args, prog_name="gymbus bench")


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        try:
            _error(f"{type(exc).__name__}: {exc} (a gymbus bug? --verbose shows the traceback)", 1)
        except typer.Exit as done:
            sys.exit(done.exit_code)


def _verbose() -> bool:
    return bool({"-v", "--verbose"} & set(sys.argv[1:])) or os.environ.get("GYMBUS_VERBOSE") == "1"


def _error(message: str, code: int) -> None:
    """Print an error as one line (and its traceback with --verbose), then exit with ``code``."""
    if _verbose():
        traceback.print_exc()
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


if __name__ == "__main__":
    main()
