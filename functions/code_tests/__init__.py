from functions.code_tests.env import ENVIRONMENT, reference

__all__ = ["ENVIRONMENT", "reference"]
