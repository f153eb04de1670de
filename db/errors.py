"""Errors the storage layer raises with a message that says how to fix the problem."""


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached or lacks what ragbot needs (pgvector)."""
