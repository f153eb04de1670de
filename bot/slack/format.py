"""Slack rendering: the model's Markdown as Slack mrkdwn, answers as Block Kit messages with a Sources list and
native feedback buttons, and Slack's own markup in users' messages turned back into plain text.

Everything shown goes through `quote_safe` first (retrieved text can never ping `<!channel>` or a user), then
Slack's escaping of `& < >`, so document text renders literally.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.chat.feedback import button_value
from bot.chat.render import SOURCES_TITLE, SourceEntry, split_text
from bot.chat.sanitize import quote_safe

SECTION_LIMIT = 3000  # characters of mrkdwn in one section block
BLOCKS_PER_MESSAGE = 45  # Slack allows 50
FEEDBACK_ACTION_ID = "ragbot_feedback"
PLACEHOLDER = "_Searching the documents…_"


def escape(text: str) -> str:
    """Slack's three control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _safe_url(url: str) -> str | None:
    return url if re.match(r"^https?://[^\s<>|]+$", url) else None


_FENCED = re.compile(r"```.*?(?:```|$)", re.S)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_MD_LINK = re.compile(r"\[([^\[\]\n]+)\]\((\S+?)\)")
_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]+?)(?<=\S)\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+", re.M)
_QUOTE = re.compile(r"^([ \t]*)&gt;[ \t]?", re.M)
_CITATION = re.compile(r"\[(\d+)\]")
_RULE = re.compile(r"^[ \t]*([-*_])([ \t]*\1){2,}[ \t]*$", re.M)


def to_mrkdwn(markdown: str, citation_urls: dict[int, str] | None = None) -> str:
    """Convert Markdown (bold, italics, strikethrough, links, headings, lists, quotes, code) to Slack mrkdwn, with
    `quote_safe` and `& < >` escaping applied. A citation `[n]` links to its source when that has a URL.

    A Markdown link becomes `label (<url>)`: the reader always sees where it goes, so a masked link copied from a
    document can't pass off one site as another."""
    stash: list[str] = []

    def keep(fragment: str) -> str:
        stash.append(fragment)
        return f"\ue000{len(stash) - 1}\ue001"

    def code(match: re.Match[str]) -> str:
        fragment = match.group(0)
        if not (fragment.endswith("```") and len(fragment) > 3) and fragment.startswith("```"):
            fragment += "\n```"
        return keep(escape(quote_safe(fragment)))

    def link(match: re.Match[str]) -> str:
        label, url = match.group(1), _safe_url(match.group(2))
        if url is None:
            return match.group(0)
        return keep(f"{escape(quote_safe(label))} (<{escape(url)}>)")

    text = _FENCED.sub(code, markdown)
    text = _INLINE_CODE.sub(code, text)
    text = _MD_LINK.sub(link, text)
    text = escape(quote_safe(text))
    text = _RULE.sub("──────────", text)
    text = _HEADING.sub(lambda m: "\ue002" + m.group(1).replace("**", "").replace("__", "") + "\ue002", text)
    text = _BOLD.sub(lambda m: "\ue002" + m.group(2) + "\ue002", text)
    text = _ITALIC.sub(lambda m: "_" + m.group(1) + "_", text)
    text = _STRIKE.sub(lambda m: "~" + m.group(1) + "~", text)
    text = _BULLET.sub(lambda m: m.group(1) + "• ", text)
    text = _QUOTE.sub(lambda m: m.group(1) + ">", text)  # a quote marker at a line start stays a quote
    text = text.replace("\ue002", "*")
    if citation_urls:
        text = _CITATION.sub(
            lambda m: keep(f"<{escape(citation_urls[int(m.group(1))])}|[{m.group(1)}]>")
            if int(m.group(1)) in citation_urls else m.group(0),
            text,
        )
    while "\ue000" in text:
        text = re.sub("\ue000(\\d+)\ue001", lambda m: stash[int(m.group(1))], text)
    return text


def stream_safe(markdown: str) -> str:
    """Text streamed as Markdown (chat.appendStream, which renders Markdown itself): mentions neutralised."""
    return quote_safe(markdown)


def sources_mrkdwn(entries: Sequence[SourceEntry], title: str = SOURCES_TITLE) -> str:
    lines = [f"*{title}*"]
    for e in entries:
        heading = f" › {escape(e.heading)}" if e.heading else ""
        if e.url:
            lines.append(f"[{e.n}] <{escape(e.url)}|{escape(e.title).replace('|', '¦')}>{heading}")
        else:
            location = f" (`{escape(e.location)}`)" if e.location and e.location != e.title else ""
            lines.append(f"[{e.n}] {escape(e.title)}{location}{heading}")
        lines += [f">_“{escape(q)}”_" for q in e.quotes]  # the span Claude cited (Anthropic Citations)
    return "\n".join(lines)


def feedback_block(answer_id: int) -> dict[str, Any]:
    return {
        "type": "context_actions",
        "elements": [{
            "type": "feedback_buttons",
            "action_id": FEEDBACK_ACTION_ID,
            "positive_button": {"text": {"type": "plain_text", "text": "Helpful"},
                                "accessibility_label": "This answer was helpful", "value": button_value("up", answer_id)},
            "negative_button": {"text": {"type": "plain_text", "text": "Not helpful"},
                                "accessibility_label": "This answer was not helpful",
                                "value": button_value("down", answer_id)},
        }],
    }


def _sections(mrkdwn: str) -> list[dict[str, Any]]:
    return [{"type": "section", "text": {"type": "mrkdwn", "text": piece}} for piece in split_text(mrkdwn, SECTION_LIMIT)]


@dataclass
class SlackMessage:
    text: str  # the notification / fallback text
    blocks: list[dict[str, Any]] = field(default_factory=list)


def _fallback_text(blocks: list[dict[str, Any]]) -> str:
    for block in blocks:
        if block.get("type") == "section":
            return block["text"]["text"][:2900]
    return "Answer"


def answer_messages(
    answer_markdown: str, sources: Sequence[SourceEntry], answer_id: int | None, note: str | None = None,
    title: str = SOURCES_TITLE,
) -> list[SlackMessage]:
    """An answer as one or more messages: the text in sections (each within Slack's limit, never cutting a link or
    a citation), then the Sources list (or a decline's closest documents, under `title`), a note, and the feedback
    buttons on the last message."""
    urls = {e.n: e.url for e in sources if e.url}
    blocks = _sections(to_mrkdwn(answer_markdown, urls))
    tail = _sections(sources_mrkdwn(sources, title)) if sources else []
    if note:
        tail.append({"type": "context", "elements": [{"type": "mrkdwn", "text": escape(note)}]})
    if answer_id is not None:
        tail.append(feedback_block(answer_id))
    return group_blocks(blocks + tail)


def group_blocks(blocks: list[dict[str, Any]]) -> list[SlackMessage]:
    messages = []
    for start in range(0, len(blocks), BLOCKS_PER_MESSAGE):
        group = blocks[start : start + BLOCKS_PER_MESSAGE]
        messages.append(SlackMessage(_fallback_text(group), group))
    return messages or [SlackMessage("…")]


def stream_tail_blocks(sources: Sequence[SourceEntry], answer_id: int | None, note: str | None = None,
                       title: str = SOURCES_TITLE) -> list[dict[str, Any]]:
    """What chat.stopStream attaches under a streamed answer."""
    blocks = _sections(sources_mrkdwn(sources, title)) if sources else []
    if note:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": escape(note)}]})
    if answer_id is not None:
        blocks.append(feedback_block(answer_id))
    return blocks


_USER_LINK = re.compile(r"<(https?://[^|>]+)(?:\|([^>]+))?>")
_MAILTO = re.compile(r"<mailto:([^|>]+)(?:\|([^>]+))?>")


def question_text(slack_text: str, bot_user_id: str | None) -> str:
    """A user's message as plain text: the bot's own mention removed, links reduced to their label or URL, and
    Slack's escaping undone."""
    text = slack_text or ""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    text = _USER_LINK.sub(lambda m: m.group(2) or m.group(1), text)
    text = _MAILTO.sub(lambda m: m.group(2) or m.group(1), text)
    text = html.unescape(text)
    return re.sub(r"[ \t]+", " ", text).strip()
