from functions.refinement_agent.agent import AGENT

__all__ = ["AGENT"]
