"""``gymbus auth``: the broker's per-role identities (broker/auth.py) for a deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from broker import credentials

app = typer.Typer(
    help="Broker identities: one nkey per role, each allowed only its own subjects.", no_args_is_help=True
)


@app.command("init")
def init(
    out: Annotated[Path, typer.Argument(help="Folder to write into (server/auth.conf, <identity>/<identity>.nk).")],
    agent: Annotated[list[str] | None, typer.Option("--agent", help="An agent of the deployment.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="An environment of the deployment.")] = None,
    rotate: Annotated[bool, typer.Option("--rotate", help="New seeds for every identity (else kept).")] = False,
) -> None:
    """Write an nkey seed per identity (admin, agent-<A>, env-<E>, submitter, profiler, janitor,
    operator, model) and the nats-server authorization block that lists their public keys and
    permissions. Existing seeds are kept, so running it again after adding a function changes only
    the block; include server/auth.conf from the server's config and reload it. A process uses its
    identity with NATS_NKEY=<identity>.nk.
    """
    try:
        written = credentials.write(out, agent or [], env or [], rotate=rotate)
    except (ValueError, OSError) as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    typer.echo(f"authorization block: {written.server_conf}")
    for name, path in written.seeds.items():
        state = "new" if name in written.created else "kept"
        typer.echo(f"  {name:<24} {path}  ({state})")
