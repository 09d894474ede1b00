"""Training with gymbus: a client any RL loop can use.

    client.py      TrainerClient (submit batches, policy versions, off-policy pacing), Batch, GroupPolicy
    samples.py     Sample (reward, components, token ids/logprobs or the trajectory, versions), Group (GRPO)
    profiles.py    the per-task profile across runs (pass rate per policy version), for curriculum filtering
    ray_actor.py   GymbusActor: ``run_rollouts(batch)`` in order, the shape of NeMo RL's NemoGym actor
    reverify.py    ``gymbus reverify RUN``: re-score stored rollouts with the current verifier
"""
