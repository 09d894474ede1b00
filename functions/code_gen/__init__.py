from functions.code_gen.env import ENVIRONMENT, reference

__all__ = ["ENVIRONMENT", "reference"]
