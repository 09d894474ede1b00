from functions.wordle.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
