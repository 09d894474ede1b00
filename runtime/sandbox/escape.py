"""The escape suite: what hostile code tries, run against a backend, and the table of what happened.

    python -m runtime.sandbox.escape --backend process [--backend bubblewrap ...] [--markdown]

Every attempt must end as a candidate verdict (never a sandbox error), within its limit, with
nothing of the host's reached: the host's /etc/passwd and a planted secret are not in any output,
no file appears outside the run's directory, the broker's port sees no connection, no process of
the run survives it, the model API key set in this process's environment (a canary) is in no output.
The tests (tests/test_sandbox_escape.py) assert exactly this for every backend the host can run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runtime.errors import SandboxError
from runtime.sandbox.config import BACKENDS, Limits, SandboxConfig
from runtime.sandbox.core import Sandbox
from runtime.sandbox.outcome import Outcome

LIMITS = Limits(wall_s=5.0, cpu_s=2, memory_mb=512, processes=64, output_bytes=10 * 1024 * 1024, file_mb=64)
"""RELIABILITY S1's limits, the wall clock shortened so the suite stays quick: 2 s CPU, 512 MiB,
64 processes, 10 MB of output, 64 MB per file, 5 s wall."""


@dataclass
class Host:
    """What the attempts aim at, set up on this host: a secret file, a listening port, a canary key."""

    secret: str = field(default_factory=lambda: f"gymbus-secret-{secrets.token_hex(8)}")
    canary: str = field(default_factory=lambda: f"sk-canary-{secrets.token_hex(12)}")
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gymbus-escape-")))
    port: int = 0
    connections: int = 0

    @property
    def secret_file(self) -> Path:
        return self.dir / "secret.txt"

    @property
    def outside(self) -> Path:
        return self.dir / "written-from-the-sandbox"

    def plant(self) -> None:
        self.dir.chmod(0o755)
        self.secret_file.write_text(self.secret)
        self.secret_file.chmod(0o644)  # world-readable: only the sandbox may stop the read
        os.environ["OPENAI_API_KEY"] = self.canary

    async def listen(self) -> asyncio.Server:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.write(b"INFO {}\r\n")  # what a nats-server says first
            writer.close()

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server


@dataclass(frozen=True)
class Attempt:
    name: str
    code: Callable[[Host], str]
    contained: Callable[[Host, Outcome], bool]
    """Nothing reached: checked on the host after the run (and on the output)."""


def _no_leak(h: Host, o: Outcome) -> bool:
    text = o.stdout + o.stderr + o.detail
    return h.secret not in text and h.canary not in text and _host_passwd() not in text


def _host_passwd() -> str:
    return Path("/etc/passwd").read_text()


ATTEMPTS: tuple[Attempt, ...] = (
    Attempt("reads /etc/passwd", lambda h: "print(open('/etc/passwd').read())", _no_leak),
    Attempt("reads a planted secret", lambda h: f"print(open({str(h.secret_file)!r}).read())", _no_leak),
    Attempt(
        "writes outside its directory",
        lambda h: f"open({str(h.outside)!r}, 'w').write('x')\nopen('/tmp/escaped', 'w').write('x')",
        lambda h, o: not h.outside.exists() and not Path("/tmp/escaped").exists(),
    ),
    Attempt(
        "connects to the broker's port",
        lambda h: f"import socket\ns = socket.create_connection(('127.0.0.1', {h.port}), 2)\nprint(s.recv(100))",
        lambda h, o: h.connections == 0 and "INFO" not in o.stdout,
    ),
    Attempt(
        "fork-bombs",
        lambda h: "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        lambda h, o: True,
    ),
    Attempt("allocates 4 GiB", lambda h: "b = bytearray(4 << 30)\nprint(len(b))", lambda h, o: o.verdict != "ok"),
    Attempt("spins the CPU", lambda h: "while True:\n    pass", lambda h, o: o.verdict == "timeout"),
    Attempt(
        "writes 1 GB",
        lambda h: (
            "chunk = b'x' * (1 << 20)\nwith open('big', 'wb') as f:\n    for _ in range(1024):\n        f.write(chunk)"
        ),
        lambda h, o: o.verdict != "ok",
    ),
    Attempt("prints 100 MB", lambda h: "print('x' * 100_000_000)", lambda h, o: o.verdict == "output_capped"),
    Attempt("sleeps forever", lambda h: "import time\ntime.sleep(10**6)", lambda h, o: o.verdict == "timeout"),
    Attempt(
        "reads os.environ for the API key",
        lambda h: (
            "import os, glob\nprint(dict(os.environ))\n"
            "for p in ['/proc/self/environ', f'/proc/{os.getppid()}/environ', '/proc/1/environ']:\n"
            "    try:\n        print(open(p, 'rb').read())\n    except OSError as e:\n        print(p, e)"
        ),
        _no_leak,
    ),
    Attempt(
        "kills its parent",
        lambda h: "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)",
        lambda h, o: True,  # this process (the worker) is still here to check it
    ),
)


@dataclass(frozen=True)
class Row:
    attempt: str
    outcome: Outcome | None
    contained: bool
    error: str = ""
    """A SandboxError instead of a verdict (a failure of the suite)."""

    def cells(self) -> list[str]:
        if self.outcome is None:
            return [self.attempt, f"sandbox_error: {self.error}", "-", "no"]
        o = self.outcome
        return [self.attempt, f"{o.verdict}: {_why(o)}", f"{o.duration_s:.2f} s", "yes" if self.contained else "NO"]


def _why(o: Outcome) -> str:
    """The evidence: the last line of a traceback, or what an exit-0 run printed, else the verdict's detail."""
    lines = [line for line in o.stderr.strip().splitlines() if line.strip()]
    if lines and o.verdict in ("error", "memory", "output_capped") and o.exit_code:
        return lines[-1][:90]
    printed = " ".join(o.stdout.split())
    return f"printed {printed[:60]!r}" + ("…" if len(printed) > 60 else "") if o.ok and printed else o.detail


async def run_suite(backend: str, host: Host | None = None, limits: Limits = LIMITS) -> list[Row]:
    sandbox = Sandbox(SandboxConfig.from_env(backend=backend, limits=limits))
    sandbox.backend  # noqa: B018  # a backend this host cannot run raises SandboxError here, once
    host = host or Host()
    host.plant()
    server = await host.listen()
    rows = []
    try:
        for attempt in ATTEMPTS:
            try:
                outcome = await sandbox.run(attempt.code(host))
            except SandboxError as exc:
                rows.append(Row(attempt.name, None, False, exc.reason))
                continue
            rows.append(Row(attempt.name, outcome, attempt.contained(host, outcome) and _no_leak(host, outcome)))
    finally:
        server.close()
        await server.wait_closed()
    return rows


def table(backend: str, rows: list[Row], markdown: bool = True) -> str:
    head = ["attempt", "outcome", "time to end", "contained"]
    if not markdown:
        return "\n".join(f"{backend:10} " + " | ".join(r.cells()) for r in rows)
    lines = [f"**{backend}**", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the sandbox escape suite and print its table.")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="default: every backend")
    parser.add_argument("--plain", action="store_true", help="plain lines instead of a Markdown table")
    args = parser.parse_args(argv)
    failed = False
    for backend in args.backend or list(BACKENDS):
        try:
            rows = asyncio.run(run_suite(backend))
        except SandboxError as exc:
            print(f"{backend}: cannot run here: {exc.reason}\n")
            continue
        print(table(backend, rows, markdown=not args.plain) + "\n")
        failed |= not all(r.contained for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
