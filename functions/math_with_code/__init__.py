from functions.math_with_code.env import ENVIRONMENT, reference

__all__ = ["ENVIRONMENT", "reference"]
