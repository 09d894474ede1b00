from functions.text_to_sql.env import ENVIRONMENT

__all__ = ["ENVIRONMENT"]
