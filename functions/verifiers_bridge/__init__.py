from functions.verifiers_bridge.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
