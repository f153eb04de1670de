"""The one way a failure reaches a chat user: a short apology with an error id; the same id is logged with the
traceback, so whoever runs ragbot can find it. Every adapter and every admin action uses these."""

from __future__ import annotations

import secrets


def new_error_id() -> str:
    """Eight hex characters: short enough to read out, unique enough to find in a day's logs."""
    return secrets.token_hex(4)


def apology(error_id: str, doing: str = "answering") -> str:
    return (f"Sorry, something went wrong while {doing} (error id `{error_id}`). Please try again in a moment; "
            "whoever runs ragbot can find this id in its logs.")
