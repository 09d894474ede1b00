"""reasoning-gym's own scorers, run off the worker's loop (``runtime.offload``): plain module-level
functions, so the verifier's process pool can pickle them, with the package imported there only.

A row written by ``gymbus tasks reasoning-gym`` names the dataset config it came from; its entry is
normally scored as read from the row (the JSON entry), and regenerated from that config when the
row says JSON loses what the scorer needs (``rebuild``: measured when the row was written). Datasets
are kept per process, so each one is built once.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

BOXED = re.compile(r"\\boxed\{([^}]+)\}")
RECIPE = ("name", "seed", "size", "config", "level")
"""The fields of a row's ``generator`` that say which dataset it came from."""


def extract(text: str) -> str | None:
    """The model's answer as NeMo Gym's reasoning_gym server reads it: the last ``<answer>`` tag,
    else the first ``\\boxed{}``, else the whole reply stripped (None when the reply is empty)."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text, tag_name="answer")
    if tagged is not None:
        return str(tagged)
    boxed = BOXED.search(text)
    if boxed:
        return boxed.group(1).strip()
    return text.strip() or None


def score(text: str, entry: dict[str, Any], generator: dict[str, Any] | None) -> dict[str, Any]:
    """The generator's score of the reply for this entry, with what it read.

    A scorer that raises on the model's answer scores it 0.0 (the answer is what it could not read),
    but only if it scores the entry's own answer without raising: a scorer that cannot score its
    oracle answer is a broken verifier, and that raises."""
    name = entry["metadata"]["source_dataset"]
    if generator is None:
        dataset = _default_dataset(name)
    else:
        recipe = json.dumps({k: generator.get(k) for k in RECIPE}, sort_keys=True)
        dataset = _dataset(recipe)
        if generator.get("rebuild"):
            entry = _entry(recipe, int(generator["index"]), entry)
    answer = extract(text)
    try:
        return {"score": float(dataset.score_answer(answer, entry)), "extracted_answer": answer}
    except Exception as exc:
        dataset.score_answer(entry.get("answer"), entry)  # raises if the scorer itself is broken
        return {"score": 0.0, "extracted_answer": answer, "reason": f"the scorer could not read it: {exc!r}"}


@functools.lru_cache(maxsize=64)
def _default_dataset(name: str) -> Any:
    """The generator with its default config, for a row that does not say which it came from (as NeMo
    Gym's server scores them)."""
    from reasoning_gym.factory import DATASETS

    dataset_cls, config_cls = DATASETS[name]
    return dataset_cls(config=config_cls())


@functools.lru_cache(maxsize=32)
def _dataset(recipe: str) -> Any:
    from functions.reasoning_gym.generate import build

    return build(json.loads(recipe))


def _entry(recipe: str, index: int, row_entry: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = _dataset(recipe)[index]
    if entry["question"] != row_entry["question"]:
        name = json.loads(recipe)["name"]
        raise ValueError(
            f"{name} entry {index} regenerated from the row's recipe asks another question than the row "
            "(another reasoning-gym version?)"
        )
    return entry
