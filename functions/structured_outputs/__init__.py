from functions.structured_outputs.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
