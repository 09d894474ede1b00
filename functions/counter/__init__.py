from functions.counter.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
