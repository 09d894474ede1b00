"""A Ray actor with the shape of NeMo RL's NemoGym actor: ``run_rollouts(batch)`` returns one result per
task row, in the order given, with token ids, logprobs and the reward, so a NeMo RL-style loop can swap
it in. Ray is not imported here: make it an actor with ``ray.remote(GymbusActor)``.

    actor = ray.remote(GymbusActor).remote(nats_url="nats://head:4222", agent="simple_agent", env="math")
    results = ray.get(actor.run_rollouts.remote(rows))      # rows: NeMo Gym-shaped task rows
    ray.get(actor.set_policy_version.remote(step + 1))      # after the trainer's update
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.trainer.client import TrainerClient
from runtime.trainer.samples import Sample


class GymbusActor:
    """Rollouts for a trainer, through a running deployment (``nats_url``) or an embedded stack
    (``embedded``: the keyword arguments of `TrainerClient.embedded`)."""

    def __init__(self, nats_url: str | None = None, embedded: dict[str, Any] | None = None, **settings: Any) -> None:
        self.nats_url, self.embedded, self.settings = nats_url, embedded, settings
        self._client: TrainerClient | None = None

    async def client(self) -> TrainerClient:
        if self._client is None:
            if self.nats_url:
                self._client = await TrainerClient.connect(self.nats_url, **self.settings)
            else:
                self._client = await TrainerClient.embedded(**(self.embedded or {}), **self.settings)
        return self._client

    async def run_rollouts(self, batch: list[dict[str, Any]], group_size: int = 1) -> list[dict[str, Any]]:
        """Each task row x ``group_size``, in order (task, then group member): a dict per rollout."""
        client = await self.client()
        submitted = await client.submit(batch, group_size)
        try:
            return [as_dict(s) for s in await submitted.results()]
        finally:
            await submitted.close()

    async def set_policy_version(self, version: int, endpoints: list[str] | None = None) -> None:
        await (await self.client()).set_policy_version(version, endpoints)

    async def shutdown(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def as_dict(s: Sample) -> dict[str, Any]:
    """A Sample as plain data (what crosses a Ray boundary): ids, mask and logprobs of the whole rollout,
    per-turn records, the reward and its components, the failure, the policy versions."""
    ids, mask, logprobs = s.tokens()
    return {
        "task_index": s.task_index,
        "rollout_index": s.rollout_index,
        "reward": s.reward,
        "components": s.components,
        "failure_kind": s.failure_kind,
        "failure_reason": s.result.failure_reason,
        "token_ids": ids,
        "loss_mask": mask,
        "generation_logprobs": logprobs,
        "token_exact": s.trajectory is not None,
        "turns": msgspec.to_builtins(s.turns),
        "policy_versions": s.policy_versions,
        "response": {"output": s.result.output},
    }
