"""What a Teams user sees of an answer: Teams markdown text whose `[n]` markers the message's citation entity turns
into reference cards (the "AI generated" label's citations), and, for a decline, the closest documents as links.

The chat core decides what to show (answer, uncertain, decline with related documents, the offline note); this
module only says how Teams shows it. Text that came from documents is quoted safely (`quote_safe`): a title can
never mention or link anyone.
"""

from __future__ import annotations

import re

from microsoft_agents.activity import Attachment
from microsoft_agents.hosting.core.app.streaming import Citation

from bot.chat.render import AnswerView, SourceEntry
from bot.chat.sanitize import strip_control

PLACEHOLDER = "_Searching the documents…_"
STATUS_SEARCHING = "Searching the documents…"
# Teams' message size limit is about 28 KB including the citations; an answer is kept well under it.
TEXT_LIMIT = 20_000
_AT_TAG = re.compile(r"</?at\b[^>]*>", re.IGNORECASE)


def safe_text(text: str) -> str:
    """Model or document text made safe to post: control characters gone, and no `<at>` tag (which, with a
    mention entity, would notify someone; without one it would show raw markup)."""
    return _AT_TAG.sub("", strip_control(text))


def _link(entry: SourceEntry) -> str:
    label = entry.title.replace("[", "(").replace("]", ")")
    return f"[{label}]({entry.url})" if entry.url else f"{label} ({entry.location})"


def answer_content(view: AnswerView) -> tuple[str, list[Citation]]:
    """The message text and its citations, from the core's view of the answer (`answer_view`)."""
    return answer_text(view), answer_citations(view)


def answer_text(view: AnswerView) -> str:
    """The message text: the offline note, the answer, for a decline the closest documents the asker may see
    (a list of links: citations are only for the documents an answer cites), and a private answer's note."""
    parts = []
    if view.note:
        parts.append(f"_{view.note}_")
    parts.append(safe_text(view.text).strip())
    if view.sources and not view.cited:
        parts.append(f"**{view.sources_title}**\n\n" + "\n".join(f"{e.n}. {_link(e)}" for e in view.sources))
    if view.private_note:
        parts.append(f"_{view.private_note}_")
    text = "\n\n".join(p for p in parts if p)
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 1].rstrip() + "…"


def share_card(answer_id: int, label: str) -> Attachment:
    """The "Share in channel" button under a private answer: an Adaptive Card holding one Action.Submit whose
    `data` comes back as the `value` of the message activity its click sends ("Card actions", Adaptive Cards
    actions: learn.microsoft.com/microsoftteams/platform/task-modules-and-cards/cards/cards-actions; the
    attachment's contentType "application/vnd.microsoft.card.adaptive": "Types of cards", same site). Teams
    renders Adaptive Cards up to schema 1.5."""
    return Attachment(content_type="application/vnd.microsoft.card.adaptive", content={
        "type": "AdaptiveCard", "$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "version": "1.5",
        "actions": [{"type": "Action.Submit", "title": label, "data": {"ragbot": "share", "answer": answer_id}}],
    })


def answer_citations(view: AnswerView) -> list[Citation]:
    """The answer's sources as the SDK's citations (title, URL, an abstract: the cited passage, else the heading
    and path), in citation order: Teams numbers them 1..n to match the `[n]` markers in the text."""
    citations = []
    for entry in view.sources if view.cited else ():
        abstract = " ".join(entry.quotes) or " · ".join(p for p in (entry.heading, entry.location) if p)
        citations.append(Citation(content=abstract or entry.title, title=entry.title, url=entry.url))
    return citations
