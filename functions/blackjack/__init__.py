from functions.blackjack.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
