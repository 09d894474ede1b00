from functions.reasoning_gym.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
