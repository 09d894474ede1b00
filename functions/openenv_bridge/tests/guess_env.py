"""An OpenEnv environment for the tests, built from openenv-core's server: guess a number from 1 to 20.

The secret is drawn from the reset's seed and kept in the episode's environment instance (the
server's memory, per WebSocket session), so a step that reached any other instance would fail: the
tests prove episodes stay pinned. Three guesses; reward 1.0 for the right one, with hints between.

    python -m uvicorn guess_env:app --port 8000
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

GUESSES = 3


def secret_of(seed: int) -> int:
    return random.Random(seed).randint(1, 20)


class Guess(Action):
    guess: int


class Hint(Observation):
    hint: str = ""
    guesses_left: int = GUESSES


class GuessEnv(Environment[Guess, Hint, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._secret: int | None = None
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Hint:
        self._secret = secret_of(seed or 0)
        self._state = State(episode_id=episode_id, step_count=0)
        return Hint(hint="guess a number from 1 to 20")

    def step(self, action: Guess, timeout_s: float | None = None, **kwargs: Any) -> Hint:
        if self._secret is None:
            raise RuntimeError("step before reset: this instance holds no episode")
        self._state.step_count += 1
        left = GUESSES - self._state.step_count
        if action.guess == self._secret:
            return Hint(hint="correct", guesses_left=left, reward=1.0, done=True)
        hint = "higher" if action.guess < self._secret else "lower"
        return Hint(hint=hint if left else "no guesses left", guesses_left=left, reward=0.0, done=left == 0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnv, Guess, Hint, env_name="guess", max_concurrent_envs=256)
