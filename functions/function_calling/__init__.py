from functions.function_calling.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
