"""The real gymbus CLI as a parser: is ``gymbus ARGS`` a valid command line, under a given environment?"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import typer

from runtime.cli import app


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ with ``env`` set (and other GYMBUS_/OTEL_ variables removed), restored after."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith(("GYMBUS_", "OTEL_"))]:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def gymbus_command_of(args: list[str]) -> tuple[Any, list[str]]:
    """The (click) command ``gymbus ARGS`` names, through sub-groups, and the arguments left for it.

    typer carries its own copy of click, so commands are recognised by what they do, not by class.
    """
    cmd = typer.main.get_command(app)
    rest = list(args)
    while hasattr(cmd, "list_commands"):
        if not rest:
            raise LookupError(f"`gymbus {' '.join(args)}`: missing command")
        name, rest = rest[0], rest[1:]
        sub = cmd.get_command(cmd.context_class(cmd), name)
        if sub is None:
            raise LookupError(f"`gymbus {' '.join(args)}`: no such command {name!r}")
        cmd = sub
    return cmd, rest


def parse_gymbus(args: list[str], env: Mapping[str, str]) -> Any:
    """Parse ``gymbus ARGS`` with the real CLI under ``env``, without running it; returns the context.

    An unknown command or option, a missing argument or a value of the wrong type raises click's error.
    """
    cmd, rest = gymbus_command_of(args)
    with environment(env):
        return cmd.make_context(cmd.name or "gymbus", rest)


def envvars_read_by(args: list[str]) -> set[str]:
    cmd, _ = gymbus_command_of(args)
    out: set[str] = set()
    for p in cmd.params:
        out |= {p.envvar} if isinstance(p.envvar, str) else set(p.envvar or [])
    return out
