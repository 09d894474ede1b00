from functions.step_agent.agent import AGENT

__all__ = ["AGENT"]
