"""What the bridges to other ecosystems' environments share (not an environment itself).

A pinned environment keeps a rollout's state in the memory of one server instance (a NeMo Gym
resources server, an OpenEnv session host), so every call of the rollout must reach that instance:
`instances.py` starts and supervises the instances a bridge runs itself, and `pins.py` records the
instance in the rollout's state and turns its loss into ``env_lost``, never a wrong reward.
"""
