from functions.arc_agi.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
