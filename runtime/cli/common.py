"""What every command shares: the consoles, common options, logging, and reaching the broker."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from broker.connect import DEFAULT_URL_ENV
from runtime.errors import UsageError

T = TypeVar("T")

console = Console()
err = Console(stderr=True)

NatsOpt = Annotated[
    str | None,
    typer.Option("--nats", envvar=DEFAULT_URL_ENV, help="Broker URL, e.g. nats://127.0.0.1:4222."),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs, and the traceback of any error.")]
RunDirOpt = Annotated[
    Path | None,
    typer.Option("--run-dir", help="A run folder of `gymbus collect` (its embedded broker is started to read it)."),
]


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO if os.environ.get("GYMBUS_LOG") == "info" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, or uvloop's when GYMBUS_UVLOOP=1 (opt-in; `pip install uvloop`)."""
    if os.environ.get("GYMBUS_UVLOOP") == "1":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def need_nats(nats: str | None, alternative: str = "") -> str:
    """The broker URL, or a one-line usage error saying how to give one."""
    if not nats:
        raise UsageError(f"no broker: give --nats URL or set GYMBUS_NATS_URL{alternative}")
    return nats


def with_broker(nats: str | None, run_dir: Path | None, fn: Callable[[str], Coroutine[Any, Any, T]]) -> T:
    """Run ``fn(url)`` against --nats, or against a run folder's embedded broker started for the purpose."""
    if nats:
        return run(fn(nats))
    if run_dir is None:
        raise UsageError("no broker: give --nats URL or --run-dir runs/<run_id>")
    if not (run_dir / "broker").is_dir():
        raise UsageError(f"{run_dir} has no broker/ folder: not a run folder of `gymbus collect`")
    from broker.server import EmbeddedServer

    with EmbeddedServer(run_dir / "broker", log_file=run_dir / "logs" / "nats-server.log") as broker:
        return run(fn(broker.url))
