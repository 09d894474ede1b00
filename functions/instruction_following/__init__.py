from functions.instruction_following.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
