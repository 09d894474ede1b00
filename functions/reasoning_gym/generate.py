"""Task rows from reasoning-gym's generators: ``gymbus tasks reasoning-gym SPEC -o tasks.jsonl``.

A dataset spec (YAML or JSON) names the generators and, for each, how many tasks, the seed and the
difficulty (the generator's config fields, or a curriculum level where it has a curriculum):

    seed: 0                 # default seed of every generator
    size: 5                 # default tasks per generator
    prompt: default         # a reasoning_gym.utils.SYSTEM_PROMPTS name, or null: no system message
    generators:
      leg_counting: {}
      basic_arithmetic: {size: 10, config: {min_terms: 2, max_terms: 4}}
      knights_knaves: {level: 1}

Each row has the shape of NeMo Gym's reasoning_gym resources server (``responses_create_params``,
``question``, ``answer``, ``metadata`` with ``source_dataset``), plus ``env`` and ``generator``: the recipe of
its dataset (name, seed, size, config, level), its index, and whether the verifier must regenerate the
entry because JSON loses what the scorer needs (``rebuild``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from runtime.errors import InputError


class GeneratorSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    size: int | None = None
    """Tasks to generate (default: the spec's ``size``)."""
    seed: int | None = None
    """The dataset's seed (default: the spec's ``seed``)."""
    config: dict[str, Any] = {}
    """The generator's own config fields (its difficulty knobs)."""
    level: int | None = None
    """A curriculum level (0 = easiest), for generators that have a curriculum; ``config`` wins over it."""


class DatasetSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    generators: dict[str, GeneratorSpec] | list[str]
    seed: int = 0
    size: int = 5
    prompt: str | None = "default"


def load_spec(path: Path) -> DatasetSpec:
    """The spec file; InputError names the file and the field."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"dataset spec {str(path)!r}: {exc.strerror or exc}") from None
    decode = msgspec.json.decode if path.suffix == ".json" else msgspec.yaml.decode
    try:
        return decode(raw, type=DatasetSpec)
    except msgspec.DecodeError as exc:
        raise InputError(f"dataset spec {path}: {exc}") from None


def rows(spec: DatasetSpec) -> Iterator[dict[str, Any]]:
    """Every task row the spec names, generator by generator; InputError names a wrong generator or field."""
    from reasoning_gym.factory import DATASETS
    from reasoning_gym.utils import SYSTEM_PROMPTS

    generators = spec.generators if isinstance(spec.generators, dict) else {n: GeneratorSpec() for n in spec.generators}
    if spec.prompt is not None and spec.prompt not in SYSTEM_PROMPTS:
        raise InputError(f"dataset spec: prompt {spec.prompt!r} is not one of {sorted(SYSTEM_PROMPTS)} (or null)")
    system = SYSTEM_PROMPTS[spec.prompt] if spec.prompt is not None else None
    for name, g in generators.items():
        if name not in DATASETS or name == "composite":
            raise InputError(
                f"dataset spec: generator {name!r} is not a reasoning-gym generator "
                "(`gymbus tasks reasoning-gym --list` lists them)"
            )
        recipe = {
            "name": name,
            "seed": spec.seed if g.seed is None else g.seed,
            "size": spec.size if g.size is None else g.size,
            "config": g.config,
            "level": g.level,
        }
        dataset = build(recipe)
        for index in range(dataset.size):
            yield _row(dataset, recipe, index, system)


def build(recipe: dict[str, Any]) -> Any:
    """The dataset a row's ``generator`` recipe names (name, seed, size, config, level): the same
    dataset whenever it is built again, which is how the verifier regenerates an entry."""
    import reasoning_gym  # noqa: F401  (importing it registers every generator)
    from reasoning_gym.factory import DATASETS, create_curriculum, has_curriculum

    name, level, overrides = recipe["name"], recipe.get("level"), recipe.get("config") or {}
    base = {"seed": recipe["seed"], "size": recipe["size"]}
    try:
        if level is not None:
            if not has_curriculum(name):
                raise InputError(f"dataset spec: generator {name!r} has no curriculum, so no `level`; set its `config`")
            curriculum = create_curriculum(name)
            curriculum.set_global_level(level)
            config = curriculum.generate_configuration(base)
            config = dataclasses.replace(config, **overrides) if overrides else config
        else:
            config = DATASETS[name][1](**{**base, **overrides})
        if hasattr(config, "validate"):
            config.validate()
        return DATASETS[name][0](config=config)
    except InputError:
        raise
    except (TypeError, ValueError, AssertionError, IndexError) as exc:
        raise InputError(f"dataset spec: generator {name!r}: {type(exc).__name__}: {exc}") from None


def _row(dataset: Any, recipe: dict[str, Any], index: int, system: str | None) -> dict[str, Any]:
    entry = dataset[index]
    as_json = json.loads(json.dumps(entry, default=str))
    items = [{"role": "system", "content": system}] if system else []
    items.append({"role": "user", "content": entry["question"]})
    return {
        "responses_create_params": {"input": items},
        "question": as_json["question"],
        "answer": as_json["answer"],
        "metadata": as_json["metadata"],
        "env": "reasoning_gym",
        "generator": {**recipe, "index": index, "rebuild": _lossy(dataset, entry, as_json)},
    }


def _lossy(dataset: Any, entry: dict[str, Any], as_json: dict[str, Any]) -> bool:
    """Whether the scorer reads the JSON entry differently from the generated one (then the verifier
    regenerates the entry from the row's config)."""
    answer = entry.get("answer")
    if answer is None:
        return False
    try:
        return bool(dataset.score_answer(answer, entry) != dataset.score_answer(as_json["answer"], as_json))
    except Exception:
        return True


def generators() -> list[str]:
    """Every generator the installed reasoning-gym has."""
    from reasoning_gym.factory import DATASETS

    return sorted(n for n in DATASETS if n != "composite")
