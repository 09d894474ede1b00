from functions.simple_agent.agent import AGENT

__all__ = ["AGENT"]
