"""workplace: a small tool world (contacts, emails, calendar) seeded per task; the reward is 1.0 iff the
world's final state is the expected one.

The world is the row's ``world`` (``contacts``, ``emails``, ``events``; a few objects each), else a
default one (``world.py``); it lives in the session record. The expected state is the row's
``expected_world``, else the seeded world with the row's ``ground_truth`` calls replayed (NeMo Gym's
field: ``[{"name", "arguments"}]``). States compare by content, the ids of new items aside, so the
same actions in another order end equal. Tool names and arguments are NeMo Gym ``workplace_assistant``'s
for email, calendar and the company directory.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from functions.workplace import world as w
from runtime.sdk import Call, Context, Environment, Reference, Rollout, Task, Tool, Verdict


class Meta(msgspec.Struct, frozen=True):
    ground_truth: list[dict[str, Any]] | None = None
    world: dict[str, list[dict[str, Any]]] | None = None
    expected_world: dict[str, list[dict[str, Any]]] | None = None

    def __post_init__(self) -> None:
        if self.ground_truth is None and self.expected_world is None:
            raise ValueError("the task row has neither `ground_truth` nor `expected_world`")
        if self.expected_world is None:
            try:
                w.replay(w.fresh(self.world), list(self.ground_truth or []))
            except (w.WorldError, TypeError, KeyError, json.JSONDecodeError) as exc:
                raise ValueError(f"`ground_truth` does not replay on the task's world: {exc}") from None

    def expected(self) -> w.World:
        return (
            self.expected_world
            if self.expected_world is not None
            else w.replay(w.fresh(self.world), list(self.ground_truth or []))
        )


async def seed(ctx: Context[Meta]) -> None:
    ctx.state["world"] = w.fresh(ctx.task.meta.world)


DESCRIPTIONS = {
    "company_directory_find_email_address": "Find the email addresses of colleagues whose name contains `name`.",
    "email_search_emails": "Search emails whose subject, body or sender contains `query`.",
    "email_get_email_information_by_id": "Get one email by its id.",
    "email_send_email": "Send an email.",
    "email_reply_email": "Reply to an email (to its sender, subject 'Re: ...').",
    "email_forward_email": "Forward an email to a recipient.",
    "email_delete_email": "Delete an email.",
    "calendar_search_events": "Search events whose name or participant contains `query`.",
    "calendar_create_event": "Create an event (start 'YYYY-MM-DD HH:MM', duration in minutes).",
    "calendar_delete_event": "Delete an event.",
    "calendar_update_event": "Set one field of an event (event_name, participant_email, event_start, duration).",
}


def _tool(name: str, op: Any) -> Tool:
    async def run(ctx: Context[Meta], **args: Any) -> Any:
        try:
            return op(ctx.state["world"], **args)
        except w.WorldError as exc:
            return {"error": str(exc)}

    run.__name__, run.__doc__ = name, DESCRIPTIONS[name]
    params = {
        p: {"type": "integer" if p == "duration" else "string"}
        for p in op.__code__.co_varnames[1 : op.__code__.co_argcount]
    }
    schema = {"type": "object", "properties": params, "required": list(params), "additionalProperties": False}
    return Tool(run, name=name, parameters=schema, context=True)


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff the final world equals the expected one; what differs in the info."""
    got, want = w.canonical(rollout.state.get("world", {})), w.canonical(task.meta.expected())
    diff = {
        k: {
            "missing": sorted(set(want[k]) - set(got.get(k, []))),
            "unexpected": sorted(set(got.get(k, [])) - set(want[k])),
        }
        for k in want
        if got.get(k) != want[k]
    }
    return Verdict(got == want, {"differs": diff} if diff else {})


def reference(task: Task[Meta]) -> Reference:
    calls = [
        Call(c["name"], json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"])
        for c in task.meta.ground_truth or []
    ]
    if not calls:
        raise ValueError("no ground_truth to play")
    return Reference(right=[calls, "Done."], wrong="I could not find what you asked for.")


ENVIRONMENT = Environment(
    name="workplace",
    meta=Meta,
    seed=seed,
    tools=[_tool(name, op) for name, op in w.OPERATIONS.items()],
    verify=verify,
    reference=reference,
    accepts=["workplace_assistant"],
)
