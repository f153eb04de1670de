"""Public or private answers in a channel (issue 33, item 4).

In a channel, an answer is either **public** (posted for the channel, from the channel's audience:
bot.chat.audience) or **private** (an ephemeral message only the asker sees, from the asker's own access, with a
"Share in channel" button that answers the question again with the channel's audience — the private text is never
reposted).

Which one: the asker says so (Slack: the word "privately" in the question; Discord: `/ask private:true`), or the
channel's default mode says so (`channel_mode`). A private answer keeps its own conversation (`private_conversation`)
so its text never enters the memory a later public answer in the same thread would draw on.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from bot.chat.channels import channel_settings

Mode = Literal["public", "private"]
DEFAULT_MODE: Mode = "public"

_PRIVATELY = re.compile(r"(?<![\w-])privately(?![\w-])[\s,:;.!?]*", re.IGNORECASE)


async def channel_mode(kb: Any, channel_key: str) -> Mode:
    """The channel's default answer mode, "public" unless an admin set it to "private".

    Set by `/kb channel mode public|private` (bot.chat.channels, stored in the database)."""
    settings = await channel_settings(kb, channel_key)
    mode = getattr(settings, "mode", None)
    return "private" if mode == "private" else "public"


def asks_privately(question: str) -> tuple[bool, str]:
    """Whether the question asks for a private answer ("privately, what is my budget?"), and the question without
    that word."""
    if not _PRIVATELY.search(question):
        return False, question
    return True, " ".join(_PRIVATELY.sub(" ", question).split())


def private_conversation(conversation_id: str, asker: str) -> str:
    """The conversation a private answer is remembered under: its own, per asker, never the thread's public one."""
    return f"{conversation_id}:private:{asker}"


def public_conversation(conversation_id: str) -> str:
    """The thread's public conversation, from a private one (what "Share in channel" answers in)."""
    return conversation_id.split(":private:", 1)[0]
