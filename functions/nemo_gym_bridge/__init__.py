from functions.nemo_gym_bridge.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
