"""The one way a failure reaches a chat user: a short apology with an error id; the same id is logged with the
traceback, so whoever runs ragbot can find it. Every adapter and every admin action uses these."""

from __future__ import annotations

import secrets

from knowledge import KnowledgeError, Remedy

# The chat's own way to each remedy a knowledge error can carry. Sources are added and removed by whoever runs
# ragbot, not from the chat: those errors say so in plain words already, and nothing is added to them.
CHAT_REMEDIES: dict[Remedy, str] = {
    Remedy.SHOW_STATUS: "`/kb status` shows it",
}


def new_error_id() -> str:
    """Eight hex characters: short enough to read out, unique enough to find in a day's logs."""
    return secrets.token_hex(4)


def apology(error_id: str, doing: str = "answering") -> str:
    return (f"Sorry, something went wrong while {doing} (error id `{error_id}`). Please try again in a moment; "
            "whoever runs ragbot can find this id in its logs.")


def chat_message(exc: KnowledgeError) -> str:
    """A knowledge error as a chat user reads it: its plain message, and the `/kb` command that helps, if any."""
    hint = CHAT_REMEDIES.get(exc.remedy) if exc.remedy is not None else None
    return f"{exc} ({hint})" if hint else str(exc)
