"""Where a worker's CPU went: collapsed stacks (py-spy ``raw``) summed by frame and by category."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

CATEGORIES: dict[str, tuple[str, ...]] = {
    "math-verify (verifier)": ("math_verify", "latex2sympy", "sympy"),
    "JSON/msgpack codec": ("msgspec", "json/decoder", "json/encoder", "json/__init__", "(json.py"),
    "KV get (direct get)": ("get_msg ",),
    "KV update (CAS publish)": ("SessionStore.update",),
    "publish + ack wait": ("publish (", "publish_raw"),
    "pull fetch": ("fetch (", "_fetch_n", "_fetch_one"),
    "ack/nak/in_progress": ("Msg.ack ", "in_progress", "_sweep"),
    "aiohttp (model HTTP)": ("aiohttp",),
    "nats-py protocol parse": ("nats/protocol/parser.py",),
    "stamina retry wrapper": ("stamina",),
    "tools (calculator, schema)": ("simpleeval", "jsonschema"),
    "asyncio event loop": ("base_events.py", "events.py", "selector_events.py", "tasks.py", "locks.py"),
}


def load(path: Path) -> Counter[str]:
    """stack -> samples."""
    stacks: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] += int(count)
    return stacks


def by_category(stacks: Counter[str]) -> dict[str, float]:
    """Fraction of samples whose stack contains a frame of each category (inclusive; they overlap)."""
    total = sum(stacks.values()) or 1
    return {
        name: sum(n for s, n in stacks.items() if any(m in s for m in marks)) / total
        for name, marks in CATEGORIES.items()
    }


def self_time(stacks: Counter[str], top: int = 15) -> list[tuple[str, float]]:
    """The leaf frames that used the most samples, as fractions."""
    total = sum(stacks.values()) or 1
    leaves: Counter[str] = Counter()
    for s, n in stacks.items():
        leaves[s.rsplit(";", 1)[-1]] += n
    return [(frame, n / total) for frame, n in leaves.most_common(top)]


def summary(path: Path) -> str:
    stacks = load(path)
    lines = [f"{path.stem}: {sum(stacks.values())} samples"]
    lines += [f"  {frac:6.1%}  {name}" for name, frac in sorted(by_category(stacks).items(), key=lambda x: -x[1])]
    lines.append("  top self time:")
    lines += [f"  {frac:6.1%}  {frame}" for frame, frac in self_time(stacks)]
    return "\n".join(lines)
