"""Platform-neutral rendering helpers: splitting long text at a platform's limit without breaking a link, a
citation or a code block, and the data of a "Sources" list. Each adapter turns these into its own markup.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.chat.sanitize import quote_safe

if TYPE_CHECKING:  # an annotation only: the terminal (and so `ragbot --help`) imports this module
    from knowledge import Answer, Citation

# Spans a split must never cut: <...> links and mentions, [text](url) links, bare URLs, citations [1], [1, 2], [2-3].
_PROTECTED = re.compile(
    r"<[^<>\n]{1,600}>"
    r"|\[[^\[\]\n]{0,300}\]\([^()\s]{1,600}\)"
    r"|https?://[^\s<>()]+"
    r"|\[\d+(?:\s*[,\u2013-]\s*\d+)*\]"
)
_FENCE = "```"
# Where to prefer breaking, best first. Each separator stays with the text before it.
_BREAKS = ("\n\n", "\n", ". ", "; ", ", ", " ")


def _inside(spans: Sequence[tuple[int, int]], cut: int) -> tuple[int, int] | None:
    for start, end in spans:
        if start < cut < end:
            return start, end
    return None


def _best_cut(text: str, limit: int) -> int:
    spans = [m.span() for m in _PROTECTED.finditer(text, 0, min(len(text), limit + 700))]
    floor = limit // 3  # never leave a tiny piece when a later, worse break exists
    for separator in _BREAKS:
        position = text.rfind(separator, 0, limit - len(separator) + 1)
        while position >= floor:
            cut = position + len(separator)
            if _inside(spans, cut) is None:
                return cut
            position = text.rfind(separator, 0, position)
    span = _inside(spans, limit)
    if span is not None and span[0] > 0:
        return span[0]  # move the whole link or citation to the next piece
    return limit  # one unbreakable run longer than the limit: nothing better exists


def split_text(text: str, limit: int) -> list[str]:
    """Pieces of at most `limit` characters, broken at paragraphs, lines, sentences or words, never inside a link,
    URL or citation. A code block cut in two is closed at the end of one piece and reopened in the next."""
    if limit < 40:
        raise ValueError("limit is too small to split text sensibly")
    pieces: list[str] = []
    rest = text.strip()
    while rest:
        if len(rest) <= limit:
            pieces.append(rest)
            break
        cut = _best_cut(rest, limit - len(_FENCE) - 1)
        piece, rest = rest[:cut].rstrip(), rest[cut:].lstrip(" \n")
        if piece.count(_FENCE) % 2 == 1:
            piece += "\n" + _FENCE
            rest = _FENCE + "\n" + rest
        if piece:
            pieces.append(piece)
    return pieces


@dataclass(frozen=True)
class SourceEntry:
    """One line of a Sources list, every field already made safe to quote (`quote_safe`)."""

    n: int
    title: str
    url: str | None
    location: str  # the path (or the document id) to show when there is no URL
    heading: str
    quotes: tuple[str, ...] = ()  # the passages Claude cited from it (Anthropic Citations), each ≤ QUOTE_CHARS


# A cited span is shown up to this many characters (the whole passage stays in the answer's JSON).
QUOTE_CHARS = 300


def short_quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """One line of a cited span, safe to quote, cut at a word with an ellipsis past `limit`."""
    line = " ".join(quote_safe(text).split())
    if len(line) <= limit:
        return line
    return line[: limit - 1].rsplit(" ", 1)[0].rstrip() + "…"


def sources_list(citations: Sequence[Citation]) -> list[SourceEntry]:
    """The numbered sources an answer cites, in citation order. Titles, paths and headings come from documents:
    they are neutralised so that, say, a title `<!channel>` can never notify anyone."""
    entries = []
    for c in sorted(citations, key=lambda c: c.n):
        url = c.url if c.url and re.match(r"^https?://[^\s<>|]+$", c.url) else None
        entries.append(
            SourceEntry(
                n=c.n, title=quote_safe(c.title or c.path or c.external_id), url=url,
                location=quote_safe(c.path or c.external_id), heading=quote_safe(c.heading or ""),
                quotes=tuple(short_quote(q) for q in getattr(c, "quotes", ())),
            )
        )
    return entries


SOURCES_TITLE = "Sources"
RELATED_TITLE = "Closest documents"
# The words every platform shows, written once (light Markdown, which each adapter converts: Slack's mrkdwn...).
# A mention (or a DM) without a question: how to ask one; the claimed event then counts as handled.
EMPTY_QUESTION = "Ask me a question about your documents, e.g. _How many vacation days do I get?_"
# Excerpts instead of a composed answer (Claude unavailable): said above the answer.
NOTE_OFFLINE = "Composed answers are unavailable right now, so these are excerpts from the documents."
# Under an answer only its asker sees in a channel: why it may say more, and the button that answers for everyone.
SHARE_LABEL = "Share in channel"
PRIVATE_NOTE = (f"Only you can see this answer: it may use documents shared with you. **{SHARE_LABEL}** answers "
                "again for everyone here.")


@dataclass(frozen=True)
class AnswerView:
    """What to show for an answer, decided here once for every platform; each adapter only says how (Block Kit,
    embeds, cards). An answer shows its text, then a list of documents under `sources_title`: the sources it cites,
    or for a decline the closest documents the asker may see (so a decline still points somewhere: issue 42 found
    one platform dropping them), or nothing; then `feedback` buttons for the delivered answer's id. `note`: said
    above it (excerpts instead of a composed answer). A private answer (only its asker sees it, in a channel)
    carries `private_note` and a `share` button with that label, whose click answers again for the channel
    (`ChatFlow.claim_share`)."""

    text: str
    sources: tuple[SourceEntry, ...]
    sources_title: str
    declined: bool
    feedback: int | None = None
    note: str | None = None
    private_note: str | None = None
    share: str | None = None

    @property
    def cited(self) -> bool:
        """Whether `sources` are what the text cites ([n] markers), not a decline's closest documents."""
        return self.sources_title == SOURCES_TITLE


def answer_view(answer: Answer, answer_id: int | None = None, *, private: bool = False) -> AnswerView:
    """The view of `answer`: its citations as Sources, or a decline's related documents as the closest ones;
    `private`: an answer only its asker sees, with the note and "Share in channel"."""
    offline = NOTE_OFFLINE if answer.mode == "extractive" and answer.note and not answer.abstained else None
    extra = {"note": offline, "private_note": PRIVATE_NOTE if private else None,
             "share": SHARE_LABEL if private and answer_id is not None else None}
    if answer.citations:
        return AnswerView(answer.text, tuple(sources_list(answer.citations)), SOURCES_TITLE, answer.abstained,
                          answer_id, **extra)
    related = list(getattr(answer, "related", None) or []) if answer.abstained else []
    return AnswerView(answer.text, tuple(sources_list(related)), RELATED_TITLE, answer.abstained, answer_id,
                      **extra)


def text_view(text: str) -> AnswerView:
    """A plain message (an apology, a refusal) as a view: no sources, no buttons."""
    return AnswerView(text, (), SOURCES_TITLE, False)
