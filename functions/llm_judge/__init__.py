from functions.llm_judge.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
