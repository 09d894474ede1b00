from functions.one_shot.agent import AGENT

__all__ = ["AGENT"]
