"""What a Teams user sees of an answer: Teams markdown text whose `[n]` markers the message's citation entity turns
into reference cards (the "AI generated" label's citations), and, for a decline, the closest documents as links.

The chat core decides what to show (answer, uncertain, decline with related documents, the offline note); this
module only says how Teams shows it. Text that came from documents is quoted safely (`quote_safe`): a title can
never mention or link anyone.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from microsoft_agents.hosting.core.app.streaming import Citation

from bot.chat.render import SOURCES_TITLE, AnswerView, SourceEntry, answer_view
from bot.chat.sanitize import strip_control

if TYPE_CHECKING:
    from knowledge import Answer

PLACEHOLDER = "_Searching the documents…_"
STATUS_SEARCHING = "Searching the documents…"
NOTE_OFFLINE = "Composed answers are unavailable right now, so these are excerpts from the documents."
EMPTY_QUESTION = "Ask me a question about your documents, e.g. _How many vacation days do I get?_"
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


def answer_content(answer: Answer) -> tuple[str, list[Citation]]:
    """The message text and its citations, from the core's view of the answer (`answer_view`)."""
    view = answer_view(answer)
    return answer_text(answer, view), answer_citations(view)


def answer_text(answer: Answer, view: AnswerView) -> str:
    """The message text: the offline note, the answer, and for a decline the closest documents the asker may see
    (a list of links: citations are only for the documents an answer cites)."""
    parts = []
    if answer.mode == "extractive" and answer.note and not view.declined:
        parts.append(f"_{NOTE_OFFLINE}_")
    parts.append(safe_text(view.text).strip())
    if view.sources and view.sources_title != SOURCES_TITLE:
        parts.append(f"**{view.sources_title}**\n\n" + "\n".join(f"{e.n}. {_link(e)}" for e in view.sources))
    text = "\n\n".join(p for p in parts if p)
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 1].rstrip() + "…"


def answer_citations(view: AnswerView) -> list[Citation]:
    """The answer's sources as the SDK's citations (title, URL, an abstract: the cited passage, else the heading
    and path), in citation order: Teams numbers them 1..n to match the `[n]` markers in the text."""
    citations = []
    for entry in view.sources if view.sources_title == SOURCES_TITLE else ():
        abstract = " ".join(entry.quotes) or " · ".join(p for p in (entry.heading, entry.location) if p)
        citations.append(Citation(content=abstract or entry.title, title=entry.title, url=entry.url))
    return citations
