"""Run one confined child to its end: feed stdin, cap the output, kill at the wall clock, classify.

Shared by the process and bubblewrap backends (they differ in the command and the confinement).
The child is the leader of its own process group; when it exits, is killed, or overruns, the whole
group gets SIGKILL and ``cleanup`` sweeps whatever left the group (see ``uids.sweep``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import IO, Any

from runtime.errors import SandboxError
from runtime.sandbox.config import Limits
from runtime.sandbox.outcome import Outcome, Verdict, classify

CHUNK = 65536


class _Output:
    """stdout and stderr of one run, against one byte budget; read until EOF (what is over the cap is dropped)."""

    def __init__(self, cap: int) -> None:
        self.room = cap
        self.over = asyncio.Event()
        self.out = bytearray()
        self.err = bytearray()

    def take(self, chunk: bytes, buf: bytearray) -> None:
        keep = min(len(chunk), self.room)
        buf += chunk[:keep]
        self.room -= keep
        if keep < len(chunk):
            self.over.set()


def _reader(loop: asyncio.AbstractEventLoop, fd: int, sink: Callable[[bytes], None]) -> asyncio.Future[None]:
    """Read ``fd`` into ``sink`` from the event loop until EOF; the future is done at EOF."""
    done: asyncio.Future[None] = loop.create_future()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            sink(chunk)
            return
        loop.remove_reader(fd)
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    return done


def _writer(loop: asyncio.AbstractEventLoop, pipe: IO[bytes], data: bytes) -> asyncio.Future[None]:
    """Write ``data`` to ``pipe`` from the event loop, then close it (EOF); a reader that went away ends it."""
    done: asyncio.Future[None] = loop.create_future()
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)

    def writable() -> None:
        nonlocal view
        try:
            view = view[os.write(fd, view[:CHUNK]) :] if view else view
        except BlockingIOError:
            return
        except OSError:  # the program exited or closed stdin without reading it all: its business
            view = view[:0]
        if not view:
            loop.remove_writer(fd)
            pipe.close()
            done.set_result(None)

    loop.add_writer(fd, writable)
    return done


def _exit(loop: asyncio.AbstractEventLoop, pid: int) -> tuple[asyncio.Future[None], int]:
    """A future done when process ``pid`` exits (its pidfd turns readable), and the pidfd."""
    done: asyncio.Future[None] = loop.create_future()
    pidfd = os.pidfd_open(pid)

    def exited() -> None:
        loop.remove_reader(pidfd)
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, exited)
    return done, pidfd


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _spawn(argv: Sequence[str], backend: str, stdin: bytes, cwd: str, spawn: dict[str, Any]) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env={},
            start_new_session=True,
            **spawn,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"{backend} sandbox could not start {argv[0]!r}: {exc}") from exc


async def _start(
    argv: Sequence[str], backend: str, stdin: bytes, cwd: str, spawn: dict[str, Any]
) -> subprocess.Popen[bytes]:
    """Fork and exec in a thread (about 10 ms the event loop need not wait); cancelled meanwhile, the
    child is killed as soon as it exists, never left running."""
    spawning = asyncio.ensure_future(asyncio.to_thread(_spawn, argv, backend, stdin, cwd, spawn))
    try:
        return await asyncio.shield(spawning)
    except asyncio.CancelledError:
        proc = await spawning
        _kill_group(proc.pid)
        proc.wait()
        raise


async def execute(
    argv: Sequence[str],
    *,
    backend: str,
    limits: Limits,
    stdin: bytes,
    cwd: str,
    spawn: dict[str, Any],
    cleanup: Callable[[], Awaitable[None]] | None = None,
    status: Callable[[int], int] | None = None,
) -> Outcome:
    """Start ``argv`` (``spawn``: extra Popen arguments: user, preexec_fn, pass_fds ...) and wait for its verdict.

    A start that fails (the command, the confinement) raises SandboxError: it says nothing about the code.
    Not asyncio's subprocess: its ``wait()`` also waits for the pipes to close, which a child the
    program left behind can hold open; here the exit is the pidfd's, and the pipes are read apart."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    proc = await _start(argv, backend, stdin, cwd, spawn)
    assert proc.stdout is not None and proc.stderr is not None
    output = _Output(limits.output_bytes)
    pipes = [
        _reader(loop, proc.stdout.fileno(), lambda c: output.take(c, output.out)),
        _reader(loop, proc.stderr.fileno(), lambda c: output.take(c, output.err)),
    ]
    feeding = _writer(loop, proc.stdin, stdin) if proc.stdin is not None else None
    exited, pidfd = _exit(loop, proc.pid)
    try:
        killed_for = await _wait(proc.pid, exited, output, limits.wall_s)
        duration = time.monotonic() - started
        _kill_group(proc.pid)  # children it left running in its group
        if cleanup is not None:
            await cleanup()
        await asyncio.wait(pipes, timeout=2.0)  # EOF once every process holding them is gone
    finally:
        _kill_group(proc.pid)
        for f in (*pipes, exited, feeding):
            if f is not None and not f.done():
                f.cancel()
        for pipe in (proc.stdout, proc.stderr, proc.stdin):
            if pipe is not None and not pipe.closed:
                loop.remove_reader(pipe.fileno()) if pipe is not proc.stdin else loop.remove_writer(pipe.fileno())
                pipe.close()
        loop.remove_reader(pidfd)
        os.close(pidfd)
        proc.wait()  # a zombie by now (or killed just above): reaps at once
    if killed_for is None and output.over.is_set():  # exited just as it went over: its output is cut all the same
        killed_for = "output_capped"
    stderr = output.err.decode(errors="replace")
    code = proc.returncode if status is None else status(proc.returncode)
    verdict, detail = classify(code, stderr, killed_for=killed_for, wall_s=limits.wall_s, cpu_s=limits.cpu_s)
    return Outcome(
        verdict=verdict,
        stdout=output.out.decode(errors="replace"),
        stderr=stderr,
        exit_code=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        duration_s=duration,
        backend=backend,
        detail=detail,
    )


async def _wait(pid: int, exited: asyncio.Future[None], output: _Output, wall_s: float) -> Verdict | None:
    """Wait for the exit; kill at the wall clock or once the output is over its cap. Returns why it was killed."""
    capped: asyncio.Future[bool] = asyncio.ensure_future(output.over.wait())
    waiting: set[asyncio.Future[Any]] = {exited, capped}
    try:
        done, _ = await asyncio.wait(waiting, timeout=wall_s, return_when=asyncio.FIRST_COMPLETED)
        if exited in done:
            return None
        _kill_group(pid)
        await exited
        return "output_capped" if capped in done else "timeout"
    finally:
        capped.cancel()
