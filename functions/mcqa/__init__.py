from functions.mcqa.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
