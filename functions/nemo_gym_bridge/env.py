"""nemo_gym_bridge: any NeMo Gym resources server, unchanged, as a gymbus environment.

The server runs as its own HTTP process in its own environment (started by the bridge, or already
running: ``servers.py``). A rollout is pinned to one instance at seed time, and its state records
the instance and the rollout's session cookie. ``seed_session``, every tool call (``POST /<tool>``)
and ``verify`` are forwarded there with that cookie, as NeMo Gym's own agent forwards them; a tool's
answer is handed to the model whatever its status, as NeMo Gym does. NeMo Gym keeps session state in
the server's memory, so an instance that died or was replaced (it answers under another name) ends
the rollout as ``env_lost``, never with a reward.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from functions.nemo_gym_bridge import servers, wire
from functions.nemo_gym_bridge.references import reference
from runtime import pins
from runtime.sdk import Context, Environment, InvalidInput, Rollout, Task, Tool, ToolError, Verdict, VerifierError

INSTANCE = "nemo_gym"
"""Where the rollout's pin lives in the environment's state: server, url, instance name, cookies."""


async def seed(ctx: Context[Any]) -> None:
    """Pin the rollout to an instance of its server and open its session there."""
    key = servers.key_of(ctx.task.meta)
    candidates = await servers.targets(key)
    url, name = random.Random(ctx.session_id).choice(sorted(candidates))
    answer = await pins.post(f"{url}/seed_session", wire.row_of(ctx.task), who=_who(key, url, name))
    if answer.status >= 400:
        raise _refused(key, "seed_session", answer)
    ctx.state[INSTANCE] = {"server": key, "url": url, "name": name, "cookies": {}}
    wire.keep_cookies(ctx.state[INSTANCE], answer.cookies)


def _who(key: str, url: str, name: str | None) -> str:
    return f"NeMo Gym server {key!r} instance {name or url}"


def _pin(ctx_state: dict[str, Any]) -> dict[str, Any]:
    pin = ctx_state.get(INSTANCE)
    if pin is None:
        raise ToolError("this rollout was never seeded on a NeMo Gym server (the run must seed sessions)")
    return pin


async def _call(state: dict[str, Any], path: str, body: Any) -> pins.Answer:
    pin = _pin(state)
    who = _who(pin["server"], pin["url"], pin["name"])
    answer = await pins.post(f"{pin['url']}{path}", body, who=who, cookies=pin["cookies"])
    wire.keep_cookies(pin, answer.cookies)
    return answer


def forward(name: str) -> Tool:
    """A tool that forwards the model's call to the pinned instance and returns what it answered."""

    async def call(ctx: Context[Any], **arguments: Any) -> str:
        return (await _call(ctx.state, f"/{name}", arguments)).text

    call.__doc__ = f"{name} (run by the NeMo Gym resources server)"
    return Tool(call, name=name, parameters={"type": "object"}, context=True)


class Forwarded(dict[str, Tool]):
    """Every tool name the model calls is forwarded (the server says which exist: an unknown one
    answers 404, which the model reads, as in NeMo Gym). It lists none: rows bring their tools."""

    def __init__(self) -> None:
        super().__init__()
        self._made: dict[str, Tool] = {}

    def get(self, name: str, default: Any = None) -> Tool:
        if name not in self._made:
            self._made[name] = forward(name)
        return self._made[name]


async def verify(task: Task[Any], rollout: Rollout) -> Verdict:
    """The server's own verify, on the instance the rollout was pinned to."""
    body = {**wire.row_of(task), "response": wire.response_of(task, rollout.output)}
    answer = await _call(rollout.state, "/verify", body)
    key = _pin(rollout.state)["server"]
    if answer.status >= 400:
        raise _refused(key, "verify", answer)
    return wire.verdict(key, answer.json(), set(body))


def _refused(key: str, what: str, answer: pins.Answer) -> Exception:
    """A seed or verify the server refused: the row's fault when it names a field (422), else the server's."""
    detail = wire.detail(answer)
    if answer.status == 422:
        return InvalidInput(f"NeMo Gym server {key!r} refused the row at {what}: {detail}")
    if what == "verify":
        return VerifierError(f"NeMo Gym server {key!r} verify answered {answer.status}: {detail}")
    return ToolError(f"NeMo Gym server {key!r} {what} answered {answer.status}: {detail}")


def _check(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """A row the bridge can route (InvalidInput names the field, or what is wrong with the servers file)."""
    try:
        servers.key_of(meta)
    except servers.SetupError as exc:
        raise InvalidInput(f"environment 'nemo_gym_bridge': {exc.reason}") from None
    return meta


ENVIRONMENT = Environment(
    name="nemo_gym_bridge",
    seed=seed,
    verify=verify,
    reference=reference,
    accepts=["*"],
)
ENVIRONMENT.by_name = Forwarded()
ENVIRONMENT.check_meta = _check  # type: ignore[method-assign]
