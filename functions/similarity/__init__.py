from functions.similarity.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
