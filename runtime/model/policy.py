"""What the SIMULATED policy plays for a task: its environment's reference (not a model's answer).

The simulated policy is given the task files it serves. For a row whose environment gives a
``reference`` (runtime/reference.py), it plays that environment's script: the right one if the
rollout's seeded draw is below the accuracy, else the plausible wrong one, turn by turn (the turn is
the number of assistant turns already in the conversation beyond the task's input, so agents that
add user turns are followed). The task is found by the session (``X-Gymbus-Session`` carries the
task index, checked against the conversation's first user message), else by that first message;
never by the last user message, which multi-turn agents change. A call for another model than the
policy (a judge) gets the reference's judge answer for what the policy played in that rollout.

Rows whose environment gives no reference fall back to the simulator's answer key (runtime/model/simulator.py).

Models an agent calls besides the policy are played by their role (``plays``, name -> role): a
``user_simulator`` says a fixed, task-independent script (``SIMULATED_USER``: a follow-up, then
``USER_STOP``), its turn counted from its own earlier turns in the request; a ``tool_simulator``
answers every call with a fixed simulated output; a ``summarizer`` with a fixed summary saying how
many model turns (its request's assistant messages) it stands for, which the policy's turn count
adds, so a compacted conversation is played on where it was. None of these is a model: they exist
so that agents' loops run end to end in tests and demos.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.schemas import parse_session_id
from runtime.items import last_user_text, message_text
from runtime.reference import Call, Reference

log = logging.getLogger("gymbus.simulator")


@dataclass
class Play:
    """What the simulated policy says now: a text, or tool calls."""

    text: str | None = None
    calls: tuple[Call, ...] = ()


USER_STOP = "###STOP###"
"""How the simulated user ends a conversation (user_sim_agent's default stop signal)."""
SIMULATED_USER = (
    "Thanks. Are you sure? Please check it once more and give me your final answer again.",
    f"Great, that is all I needed. {USER_STOP}",
)
SIMULATED_TOOL_OUTPUT = '{"status": "ok", "note": "simulated tool output"}'
SIMULATED_SUMMARY = "Summary (simulated, not a model's): {turns} earlier model turns, nothing of them kept."
_SUMMARIZED = re.compile(r"Summary \(simulated, not a model's\): (\d+) earlier model turns")
ROLES = ("judge", "user_simulator", "tool_simulator", "summarizer")


@dataclass
class Row:
    index: int
    row: dict[str, Any]
    env: str | None
    first_user: str
    input_turns: int
    input_users: int = 1


def first_user_text(items: Any) -> str:
    """The text of the first user message (the whole input when it is a string)."""
    if isinstance(items, str):
        return items.strip()
    for item in items or []:
        if isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message":
            return message_text(item).strip()
    return ""


def assistant_turns(items: Any) -> int:
    """Model turns in a conversation: an assistant message is one, a run of function calls is one."""
    if isinstance(items, str):
        return 0
    turns, in_calls = 0, False
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "function_call":
            turns += not in_calls
            in_calls = True
        elif kind == "message" and item.get("role") == "assistant":
            turns += not (in_calls and not message_text(item))
            in_calls = False
        elif kind != "reasoning":
            in_calls = False
    return turns


REFS_KEPT = 65_536
"""References an AnswerBook keeps (far more than rollouts in flight)."""


@dataclass
class AnswerBook:
    """The rows the simulated policy serves, and their environments' references."""

    rows: list[Row] = field(default_factory=list)
    seed: int = 0
    known: dict[str, Any] = field(default_factory=dict)
    """Environments by name that need not be under functions/ (``gymbus check module:OBJECT``)."""
    plays: dict[str, str] = field(default_factory=dict)
    """Named models it plays by role (user_simulator, tool_simulator, summarizer); others are judges."""
    _by_first: dict[str, int] = field(default_factory=dict)
    _refs: OrderedDict[tuple[int, int], Reference | None] = field(default_factory=OrderedDict)
    """The references of the rollouts played lately, by (task, rollout): a rollout asks on each of its
    turns. The REFS_KEPT most recent only; one evicted is made again, the same."""
    _prompts: dict[int, str | None] = field(default_factory=dict)
    """`task_prompt` by row, worked out on its first call."""

    @classmethod
    def from_files(
        cls, paths: Iterable[str | Path], env: str | None = None, seed: int = 0, known: Any = None
    ) -> AnswerBook:
        book = cls(seed=seed, known={known.name: known} if known is not None else {})
        for path in paths:
            for line in Path(path).read_text().splitlines():
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    items = row["responses_create_params"]["input"]
                except (ValueError, KeyError, TypeError):
                    row, items = {}, []  # unreadable: gymbus fails it as invalid input, but it keeps its index
                book.add(row if isinstance(row, dict) else {}, items, env)
        return book

    def add(self, row: dict[str, Any], items: Any, env: str | None) -> None:
        routed = _env_of(row, env)
        entry = Row(len(self.rows), row, routed, first_user_text(items), assistant_turns(items), user_turns(items))
        self.rows.append(entry)
        self._by_first.setdefault(entry.first_user, entry.index)

    def find(self, session: str, items: Any, *, by_session: bool = False) -> Row | None:
        """The row of this conversation: by the session's task index when its first user message agrees
        (or always, ``by_session``: a judge's prompt is not the task's), else by that first message."""
        return self._find(_task_index(session), first_user_text(items), by_session)

    def _find(self, task: int | None, first: str, by_session: bool = False) -> Row | None:
        if task is not None and task < len(self.rows) and (by_session or self.rows[task].first_user == first):
            return self.rows[task]
        index = self._by_first.get(first)
        return self.rows[index] if index is not None else None

    def reference(self, row: Row, session: str) -> Reference | None:
        if not row.env:  # no environment, no reference: nothing to make or keep
            return None
        rollout = _rollout_index(session)
        key = (row.index, rollout)
        if key in self._refs:
            self._refs.move_to_end(key)
            return self._refs[key]
        ref = self._refs[key] = _reference(row, rollout, self.known)
        if len(self._refs) > REFS_KEPT:  # a run of a million rollouts kept a million of them
            self._refs.popitem(last=False)
        return ref

    def correct(self, row: Row, session: str, accuracy: float) -> bool:
        digest = hashlib.sha256(f"{self.seed}|{row.index}|{_rollout_index(session)}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < accuracy

    def play(self, row: Row, ref: Reference, correct: bool, items: Any) -> Play:
        """The turn of the script this conversation is at (past its end: the last text, or 'done')."""
        script = ref.script(correct)
        turn = assistant_turns(items) - row.input_turns + summarized(items)
        if turn < len(script):
            now = script[turn]
            return Play(text=now) if isinstance(now, str) else Play(calls=now)
        last = script[-1]
        return Play(text=last if isinstance(last, str) else "Done.")

    def answer(self, items: Any, session: str, model: str, policy: str, accuracy: float) -> Play | None:
        """The reference's turn for this conversation, or None when its task has no reference. A call
        for a model that is neither the policy nor the task's own ``model`` is a judge's."""
        index, first = _task_index(session), first_user_text(items)  # found once, looked up twice
        task = self._find(index, first, by_session=True)
        role = self.plays.get(model)
        if role in ("user_simulator", "tool_simulator", "summarizer"):
            return self.stand_in(role, task, items)
        asked = {policy, (task.row.get("responses_create_params") or {}).get("model") if task else None}
        judging = bool(model) and model not in asked
        row = task if judging else self._find(index, first)
        ref = self.reference(row, session) if row is not None else None
        if row is None or ref is None:
            return None
        correct = self.correct(row, session, accuracy)
        return self.judge(row, ref, correct, items) if judging else self.play(row, ref, correct, items)

    def stand_in(self, role: str, task: Row | None, items: Any) -> Play:
        """What a simulated user, tool or summarizer says (see the module docstring)."""
        if role == "tool_simulator":
            return Play(text=SIMULATED_TOOL_OUTPUT)
        if role == "summarizer":  # it says how many model turns it covers, so play goes on from there
            return Play(text=SIMULATED_SUMMARY.format(turns=_assistant_messages(items) + summarized(items)))
        # the user simulator sees the dialogue from its side: its own turns (the task's opening
        # included) are the assistant's
        said = _assistant_messages(items) - (task.input_users if task else 1)
        return Play(text=SIMULATED_USER[min(max(said, 0), len(SIMULATED_USER) - 1)])

    def task_prompt(self, items: Any, session: str) -> str | None:
        """The task's own prompt (its input's last user message) when the session's task is known, so
        a user turn an agent adds does not hide it (the answer-key path)."""
        row = self.find(session, items)
        if row is None:
            return None
        if row.index not in self._prompts:
            task_input = (row.row.get("responses_create_params") or {}).get("input")
            self._prompts[row.index] = last_user_text(task_input) if isinstance(task_input, (str, list)) else None
        return self._prompts[row.index]

    def judge(self, row: Row, ref: Reference, correct: bool, items: Any) -> Play:
        """What a judge says of this rollout (what its environment's reference says it answers)."""
        if ref.judge is None:
            return Play(text="")
        if callable(ref.judge):
            return Play(text=ref.judge(correct, [] if isinstance(items, str) else list(items)))
        return Play(text=ref.judge[correct])


def user_turns(items: Any) -> int:
    """User messages in a conversation (the whole input counts as one when it is a string)."""
    if isinstance(items, str):
        return 1
    return sum(1 for i in items or [] if isinstance(i, dict) and i.get("role") == "user")


def summarized(items: Any) -> int:
    """Model turns that the simulated summarizer's summaries in this conversation stand for."""
    if isinstance(items, str):
        return 0
    texts = (message_text(i) for i in items or [] if isinstance(i, dict) and i.get("role") in ("user", "system"))
    return sum(int(n) for text in texts for n in _SUMMARIZED.findall(text))


def _assistant_messages(items: Any) -> int:
    if isinstance(items, str):
        return 0
    return sum(1 for i in items or [] if isinstance(i, dict) and i.get("role") == "assistant")


def _task_index(session: str) -> int | None:
    try:
        return parse_session_id(session)[1]
    except ValueError:
        return None


def _rollout_index(session: str) -> int:
    try:
        return parse_session_id(session)[2]
    except ValueError:
        return 0


def _env_of(row: dict[str, Any], default: str | None) -> str | None:
    from runtime.routing import route

    if default is None and "env" not in row and "agent_ref" not in row:
        return None
    try:
        return route(row, "simple_agent", default or "").env or None
    except Exception as exc:
        log.debug("row routes nowhere: %s", exc)
        return None


def _reference(row: Row, rollout: int, known: dict[str, Any]) -> Reference | None:
    from runtime.routing import environment
    from runtime.taskrows import task_of

    env = (known.get(row.env) or environment(row.env)) if row.env else None
    if env is None or env.reference is None:
        return None
    try:
        return env.reference(task_of(env, row.row, row.index, rollout))
    except Exception as exc:  # a row its environment refuses: the rollout fails there, not here
        log.debug("no reference for task %d: %s", row.index, exc)
        return None
