from functions.openenv_bridge.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
