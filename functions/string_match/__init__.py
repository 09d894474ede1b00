from functions.string_match.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
