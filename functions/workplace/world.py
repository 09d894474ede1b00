"""The workplace's tool world: contacts, emails and calendar events, as plain data and plain operations.

Every operation takes the world (a dict of lists) and changes it in place or reads it; the tools call
them on the session's state, and the verifier replays the row's ground truth with them on a copy of
the seeded world, so both sides change the world the same way.
"""

from __future__ import annotations

import copy
import json
from typing import Any

World = dict[str, list[dict[str, Any]]]

DEFAULT: World = {
    "contacts": [
        {"name": "Carlos Diaz", "email": "carlos@acme.test"},
        {"name": "Priya Nair", "email": "priya@acme.test"},
        {"name": "Tom Berg", "email": "tom@acme.test"},
        {"name": "Lena Vogel", "email": "lena@acme.test"},
    ],
    "emails": [
        {
            "email_id": "e1",
            "sender": "carlos@acme.test",
            "recipient": "me@acme.test",
            "subject": "Prototype status",
            "body": "The report prototype is half done.",
        },
        {
            "email_id": "e2",
            "sender": "priya@acme.test",
            "recipient": "me@acme.test",
            "subject": "Budget review",
            "body": "Can we move the budget review?",
        },
        {
            "email_id": "e3",
            "sender": "tom@acme.test",
            "recipient": "me@acme.test",
            "subject": "Lunch",
            "body": "Lunch on Friday?",
        },
    ],
    "events": [
        {
            "event_id": "v1",
            "event_name": "Budget review",
            "participant_email": "priya@acme.test",
            "event_start": "2026-12-02 10:00",
            "duration": 60,
        },
        {
            "event_id": "v2",
            "event_name": "Team sync",
            "participant_email": "lena@acme.test",
            "event_start": "2026-12-03 14:00",
            "duration": 30,
        },
    ],
}


class WorldError(ValueError):
    """An operation the world refuses (unknown id, unknown field): the model reads the message."""


def fresh(world: World | None) -> World:
    return copy.deepcopy(world if world is not None else DEFAULT)


def _find(items: list[dict[str, Any]], key: str, value: str) -> dict[str, Any]:
    for item in items:
        if item.get(key) == value:
            return item
    raise WorldError(f"no item with {key} {value!r}")


def _next_id(items: list[dict[str, Any]], key: str, prefix: str) -> str:
    """A new item's id: ``<prefix><n>n``, n one past the highest of the new items (seeded ids have no ``n``)."""
    made = [int(str(i[key])[len(prefix) : -1]) for i in items if str(i.get(key, "")).endswith("n")]
    return f"{prefix}{max(made, default=0) + 1}n"


def find_email_address(w: World, name: str) -> list[str]:
    return [c["email"] for c in w["contacts"] if name.lower() in c["name"].lower()]


def search_emails(w: World, query: str) -> list[dict[str, Any]]:
    q = query.lower()
    return [e for e in w["emails"] if q in e["subject"].lower() or q in e["body"].lower() or q in e["sender"]]


def get_email(w: World, email_id: str) -> dict[str, Any]:
    return _find(w["emails"], "email_id", email_id)


def send_email(w: World, recipient: str, subject: str, body: str) -> str:
    new = {
        "email_id": _next_id(w["emails"], "email_id", "e"),
        "sender": "me@acme.test",
        "recipient": recipient,
        "subject": subject,
        "body": body,
    }
    w["emails"].append(new)
    return new["email_id"]


def reply_email(w: World, email_id: str, body: str) -> str:
    original = get_email(w, email_id)
    return send_email(w, original["sender"], f"Re: {original['subject']}", body)


def forward_email(w: World, email_id: str, recipient: str) -> str:
    original = get_email(w, email_id)
    return send_email(w, recipient, f"Fwd: {original['subject']}", original["body"])


def delete_email(w: World, email_id: str) -> str:
    w["emails"].remove(get_email(w, email_id))
    return f"deleted {email_id}"


def search_events(w: World, query: str) -> list[dict[str, Any]]:
    q = query.lower()
    return [e for e in w["events"] if q in e["event_name"].lower() or q in e["participant_email"]]


def create_event(w: World, event_name: str, participant_email: str, event_start: str, duration: int) -> str:
    new = {
        "event_id": _next_id(w["events"], "event_id", "v"),
        "event_name": event_name,
        "participant_email": participant_email,
        "event_start": event_start,
        "duration": duration,
    }
    w["events"].append(new)
    return str(new["event_id"])


def delete_event(w: World, event_id: str) -> str:
    w["events"].remove(_find(w["events"], "event_id", event_id))
    return f"deleted {event_id}"


def update_event(w: World, event_id: str, field: str, new_value: str) -> str:
    event = _find(w["events"], "event_id", event_id)
    if field not in ("event_name", "participant_email", "event_start", "duration"):
        raise WorldError(f"events have no field {field!r}")
    event[field] = int(new_value) if field == "duration" else new_value
    return f"updated {event_id}"


OPERATIONS = {
    "company_directory_find_email_address": find_email_address,
    "email_search_emails": search_emails,
    "email_get_email_information_by_id": get_email,
    "email_send_email": send_email,
    "email_reply_email": reply_email,
    "email_forward_email": forward_email,
    "email_delete_email": delete_email,
    "calendar_search_events": search_events,
    "calendar_create_event": create_event,
    "calendar_delete_event": delete_event,
    "calendar_update_event": update_event,
}


def replay(world: World, calls: list[dict[str, Any]]) -> World:
    """The world after the calls (``{"name", "arguments"}``, arguments an object or a JSON string)."""
    for c in calls:
        args = json.loads(c["arguments"]) if isinstance(c.get("arguments"), str) else c.get("arguments") or {}
        if c["name"] not in OPERATIONS:
            raise WorldError(f"ground truth calls an unknown tool {c['name']!r}")
        operation: Any = OPERATIONS[c["name"]]
        operation(world, **args)
    return world


def canonical(world: World) -> dict[str, list[str]]:
    """The world's content, ids of new items aside (two orders of the same actions end equal)."""
    strip = {"email_id", "event_id"}
    return {
        kind: sorted(
            json.dumps({k: v for k, v in item.items() if k not in strip or not str(v).endswith("n")}, sort_keys=True)
            for item in items
        )
        for kind, items in world.items()
    }
