from functions.genrm_compare.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
