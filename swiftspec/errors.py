"""The one exception type that reaches users as a one-line message (exit code 2, HTTP 4xx)."""


class UserError(Exception):
    """Bad input from the user: a path, a file, a flag or a request. Its message is one line."""
