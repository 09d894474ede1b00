"""blackjack: play a hand through tool calls (``hit``, ``stand``); +1 win, 0 draw, -1 loss.

The deal comes from a deck shuffled by the row's ``seed`` (else by the task and rollout index), so
every replica, the verifier and the reference replay the same cards; the game lives in the session
record. Each action records a step reward (0 while the hand goes on, the outcome when it ends, which
ends the episode: ``steps=True``, step_agent fits).
The dealer draws to 17. An unfinished hand scores as a loss. Rows of NeMo Gym's ``blackjack``
resources server run unchanged; its players answer with ``<action>`` tags, here the tools are offered.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

from runtime.sdk import Context, Environment, Reference, Rollout, Task, Verdict, call, tool

RANKS = ["2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K", "A"]


class Meta(msgspec.Struct, frozen=True):
    seed: int | None = None


def deck(task: Task[Meta]) -> list[str]:
    cards = RANKS * 4
    random.Random(task.meta.seed if task.meta.seed is not None else 7919 * task.index + task.rollout_index).shuffle(
        cards
    )
    return cards


def value(hand: list[str]) -> int:
    total = sum(10 if r in "JQK" else 11 if r == "A" else int(r) for r in hand)
    aces = hand.count("A")
    while total > 21 and aces:
        total, aces = total - 10, aces - 1
    return total


def play(cards: list[str], hits: int) -> tuple[float, dict[str, Any]]:
    """The outcome of hitting ``hits`` times then standing (or busting first)."""
    player, dealer, pos = [cards[0], cards[2]], [cards[1], cards[3]], 4
    for _ in range(hits):
        player.append(cards[pos])
        pos += 1
        if value(player) > 21:
            return -1.0, {"result": "bust", "player": player, "dealer": dealer}
    while value(dealer) < 17:
        dealer.append(cards[pos])
        pos += 1
    p, d = value(player), value(dealer)
    result = 1.0 if d > 21 or p > d else 0.0 if p == d else -1.0
    return result, {"result": {1.0: "win", 0.0: "draw", -1.0: "loss"}[result], "player": player, "dealer": dealer}


async def seed(ctx: Context[Meta]) -> None:
    cards = deck(ctx.task)
    ctx.state.update(cards=cards, hits=0, over=False, outcome=None)


def _view(state: dict[str, Any]) -> dict[str, Any]:
    cards, hits = state["cards"], state["hits"]
    player = [cards[0], cards[2], *cards[4 : 4 + hits]]
    return {"your_hand": player, "your_total": value(player), "dealer_shows": cards[1], "game_over": state["over"]}


@tool(context=True)
async def hit(ctx: Context[Meta]) -> dict[str, Any]:
    """Take another card."""
    s = ctx.state
    if s["over"]:
        return {"error": "the hand is over", **_view(s)}
    s["hits"] += 1
    if value(_view(s)["your_hand"]) > 21:
        s["over"], s["outcome"] = True, play(s["cards"], s["hits"])
        ctx.step_reward(s["outcome"][0], terminated=True)
        return {**_view(s), "result": "bust"}
    ctx.step_reward(0.0)
    return _view(s)


@tool(context=True)
async def stand(ctx: Context[Meta]) -> dict[str, Any]:
    """Stop taking cards; the dealer plays and the hand is settled."""
    s = ctx.state
    if s["over"]:
        return {"error": "the hand is over", **_view(s)}
    s["over"], s["outcome"] = True, play(s["cards"], s["hits"])
    ctx.step_reward(s["outcome"][0], terminated=True)
    return {**_view(s), **s["outcome"][1]}


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """The settled hand's outcome (+1, 0, -1); an unfinished hand is a loss."""
    outcome = rollout.state.get("outcome")
    if outcome is None:
        return Verdict(-1.0, {"result": "unfinished"})
    return Verdict(outcome[0], outcome[1])


def reference(task: Task[Meta]) -> Reference:
    cards = deck(task)
    best = max(range(6), key=lambda h: (play(cards, h)[0], -h))
    bust = next(h for h in range(1, 12) if play(cards, h)[1]["result"] == "bust")
    return Reference(
        right=[*[call("hit")] * best, call("stand"), "Hand played."],
        wrong=[*[call("hit")] * bust, "Hand played."],
    )


ENVIRONMENT = Environment(
    name="blackjack",
    meta=Meta,
    seed=seed,
    tools=[hit, stand],
    verify=verify,
    reference=reference,
    reward_range=(-1.0, 1.0),
    accepts=["blackjack"],
    steps=True,
)
