"""Running an existing agent harness (any program that speaks the OpenAI API) as one long agent step.

    run = await run_harness(ctx, ["python", "my_agent.py"], timeout_s=600)   # inside an agent's step

The harness is started as a child process with ``OPENAI_BASE_URL`` (and ``OPENAI_API_KEY``) pointing
at a recording endpoint served for this rollout alone (runtime/recorder.py): every model call it
makes goes through the model tier and into the rollout's conversation. It gets the task in
``GYMBUS_TASK`` (a JSON file: ``messages``, ``input``, ``tools``, ``model``), the prompt in
``GYMBUS_PROMPT`` and the model name in ``OPENAI_MODEL``, never the verifier's fields, and runs in a
fresh working directory. The step lasts as long as the harness: the worker's in-progress acks keep
its message alive, the step's deadline bounds it.

If the worker dies meanwhile, the harness (its child, killed with it) never finishes the step, and
the broker redelivers the step: the harness is then run again from the start, as a new run of the
step, and the Result says so (``agent_info.harness.runs``, ``restarts``). A small record per rollout
in the KV bucket ``harness`` (which run, which worker, how many calls) is how the next run knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BadRequestError, KeyNotFoundError, NotFoundError

from broker.server import die_with_parent
from runtime.agent import AgentContext
from runtime.errors import HarnessError, Timeout
from runtime.items import last_user_text
from runtime.judges import current_js
from runtime.model import translate
from runtime.recorder import Recorder

BUCKET = "harness"
RECORD_TTL_S = 24 * 3600.0
TAIL = 4000
"""Characters of the harness's stdout and stderr kept (the ends)."""
FILE_LIMIT = 256 * 1024
"""Largest output file kept (``outputs``), in bytes."""
_HIDDEN = ("GYMBUS_", "NATS_", "OPENAI_", "OTEL_")
"""Environment variables of the worker a harness never sees (credentials, the worker's own settings)."""


@dataclass
class HarnessRun:
    """How a harness run ended."""

    exit_code: int
    calls: int
    runs: int
    """Which run of this step it was (1; more after a worker was lost during an earlier one)."""
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    files: dict[str, str] = field(default_factory=dict)


async def run_harness(
    ctx: AgentContext,
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    outputs: Sequence[str] = (),
) -> HarnessRun:
    """Run ``command`` for this rollout (see the module docstring). Raises the model tier's error when a
    model call failed, `Timeout` past ``timeout_s``, `HarnessError` when it exits with an error."""
    book = await _Book.open(ctx)
    recorder = Recorder(ctx, on_call=book.calls)
    workdir = Path(tempfile.mkdtemp(prefix="gymbus-harness-"))
    try:
        base_url = await recorder.start()
        proc = await _spawn(ctx, command, workdir, base_url, recorder.token, env or {})
        recorder.stop = lambda: _kill(proc)
        await book.started(proc.pid)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            raise Timeout(f"harness {command[0]!r} ran past timeout_s={timeout_s:g}") from None
        finally:
            _kill(proc)
        run = HarnessRun(proc.returncode or 0, recorder.calls, book.run, _tail(out), _tail(err), recorder.truncated)
        if recorder.failure is not None:
            raise recorder.failure
        if run.exit_code != 0 and not run.truncated:
            why = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "no output on stderr"
            status = f"exited with status {run.exit_code} after {run.calls} model calls"
            raise HarnessError(f"harness {command[0]!r} {status}: {why}")
        run.files = _files(workdir, outputs)
        ctx.info["harness"] = book.report(run)
        if run.files:
            ctx.info["files"] = run.files
        return run
    finally:
        await recorder.close()
        shutil.rmtree(workdir, ignore_errors=True)


async def _spawn(
    ctx: AgentContext, command: Sequence[str], workdir: Path, base_url: str, token: str, extra: Mapping[str, str]
) -> asyncio.subprocess.Process:
    task = workdir / ".gymbus-task.json"
    items = ctx.items[: ctx.n_input]
    tools = list(ctx.params.get("tools") or [])
    task.write_text(
        json.dumps(
            {
                "input": items,
                "messages": translate.items_to_messages(items, ctx.params.get("instructions")),
                "tools": tools,
                "model": ctx.session.model,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(_HIDDEN)}
    env.update(extra)
    env.update(
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY=token,
        OPENAI_MODEL=ctx.session.model,
        GYMBUS_TASK=str(task),
        GYMBUS_PROMPT=last_user_text(items),
        GYMBUS_SESSION=ctx.session.session_id,
    )
    try:
        return await asyncio.create_subprocess_exec(
            *command,
            cwd=workdir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,  # killed with its worker, never left running
        )
    except OSError as exc:
        raise HarnessError(f"harness {command[0]!r} could not be started: {exc}") from None


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _tail(data: bytes | None) -> str:
    text = (data or b"").decode("utf-8", errors="replace")
    return text[-TAIL:]


def _files(workdir: Path, names: Sequence[str]) -> dict[str, str]:
    """The harness's output files that exist (text, within the size limit), by relative path."""
    found: dict[str, str] = {}
    for name in names:
        path = (workdir / name).resolve()
        if workdir.resolve() not in path.parents or not path.is_file():
            continue
        data = path.read_bytes()[: FILE_LIMIT + 1]
        text = data[:FILE_LIMIT].decode("utf-8", errors="replace")
        found[name] = text + ("\n[truncated]" if len(data) > FILE_LIMIT else "")
    return found


@dataclass
class _Book:
    """The rollout's record in the ``harness`` bucket: which run of which step, on which worker."""

    ctx: AgentContext
    kv: Any
    key: str
    run: int = 1
    lost: dict[str, Any] | None = None
    _record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    async def open(cls, ctx: AgentContext) -> _Book:
        js = current_js()
        kv = await _bucket(js) if js is not None else None
        book = cls(ctx, kv, ctx.session.session_id)
        before = await book._read()
        s = ctx.session
        if before and before.get("step") == s.step and before.get("attempt") == s.attempt:
            book.run, book.lost = int(before.get("run", 1)) + 1, before  # a run of this step never finished
        return book

    async def started(self, pid: int) -> None:
        s = self.ctx.session
        worker = f"{socket.gethostname()}:{os.getpid()}"
        self._record = {"step": s.step, "attempt": s.attempt, "run": self.run, "worker": worker, "pid": pid}
        self._record.update(started_at=time.time(), calls=0)
        await self._write()

    async def calls(self, n: int) -> None:
        self._record["calls"] = n
        await self._write()

    def report(self, run: HarnessRun) -> dict[str, Any]:
        out: dict[str, Any] = {"runs": run.runs, "calls": run.calls, "exit_code": run.exit_code}
        if run.truncated:
            out["truncated"] = True
        if self.lost is not None:
            lost = {k: self.lost.get(k) for k in ("run", "worker", "started_at", "calls")}
            out["restarts"] = [{**lost, "reason": "its worker was lost before the step was committed"}]
        if run.stdout:
            out["stdout"] = run.stdout
        return out

    async def _read(self) -> dict[str, Any] | None:
        if self.kv is None:
            return None
        try:
            entry = await self.kv.get(self.key)
        except (KeyNotFoundError, NotFoundError):
            return None
        try:
            value = json.loads(entry.value or b"null")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    async def _write(self) -> None:
        if self.kv is not None:
            await self.kv.put(self.key, json.dumps(self._record).encode())


async def _bucket(js: Any) -> Any:
    try:
        return await js.key_value(BUCKET)
    except (NotFoundError, BadRequestError):
        with contextlib.suppress(BadRequestError):  # another worker created it first
            config = KeyValueConfig(bucket=BUCKET, history=1, ttl=RECORD_TTL_S, storage=StorageType.FILE)
            await js.create_key_value(config)
        return await js.key_value(BUCKET)
