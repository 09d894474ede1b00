from functions.workplace.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
