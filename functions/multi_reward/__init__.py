from functions.multi_reward.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
