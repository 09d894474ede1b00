from functions.compaction_agent.agent import AGENT

__all__ = ["AGENT"]
