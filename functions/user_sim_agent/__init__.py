from functions.user_sim_agent.agent import AGENT

__all__ = ["AGENT"]
