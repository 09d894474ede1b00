from functions.tool_simulation_agent.agent import AGENT

__all__ = ["AGENT"]
