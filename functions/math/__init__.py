from functions.math.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
