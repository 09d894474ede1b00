from functions.harness_agent.agent import AGENT

__all__ = ["AGENT"]
