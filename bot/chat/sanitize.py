"""Sanitising document-derived text before any human or platform sees it.

Retrieved text (titles, paths, headings, snippets, excerpts, and answers composed from them) is data written by
whoever wrote the documents. On a terminal, an escape sequence in it can retitle the window or clear the screen; in
Slack or Discord, `<!channel>` or `@everyone` in it would notify a whole channel, and a markdown image would be
fetched and shown. This module is the one platform-neutral step every surface applies first:

- `strip_control` removes terminal escape sequences and control characters (keeping newlines and tabs), bidi
  override characters that reorder what is displayed, and lone surrogates (from undecodable file names).
- `quote_safe` does that and then neutralises mention and markup syntax that a platform would act on, by inserting
  a zero-width space so the text still reads the same but no longer parses as a mention, link or image.

Platform renderers then apply their own escaping (Slack `& < >`, Discord `allowed_mentions`) on top.
"""

from __future__ import annotations

import re

ZERO_WIDTH_SPACE = "\u200b"

# Escape sequences, as a terminal parses them (ECMA-48). Strings (OSC, DCS, SOS, PM, APC) run to their terminator
# (BEL or ST); an unterminated one is cut at the end of the line, so the visible text after it survives.
_STRING_SEQUENCE = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
_CSI_SEQUENCE = r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
_OTHER_ESCAPE = r"\x1b[\x20-\x2f]*[\x30-\x7e]?"
_ESCAPE_SEQUENCES = re.compile("|".join((_STRING_SEQUENCE, _CSI_SEQUENCE, _OTHER_ESCAPE)))
# C0 controls except \t and \n, DEL, C1 controls; bidi embeddings/overrides/isolates (they reorder displayed text);
# lone surrogates (a file name that was not valid UTF-8, decoded with surrogateescape).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_LINE_BREAKS = re.compile("\r\n?|[\u2028\u2029\x85]")

# `<` that opens Slack or Discord markup: <!channel> <!here> <!everyone> <!subteam^…> <@U…> <@!id> <@&id> <#C…>,
# a Discord command mention </name:id>, or a link <https://…|text>.
_ANGLE_MARKUP = re.compile(r"<(?=[!@#]|/[\w -]+:\d+>|[a-z][a-z0-9+.\-]*:)", re.IGNORECASE)
# Plain-text broadcast mentions (Discord @everyone/@here; Slack @channel/@here/@everyone with link_names).
_AT_MENTION = re.compile(r"@(?=(?:everyone|here|channel)\b)", re.IGNORECASE)
# A markdown link or image: `[text](url)` / `![alt](url)`: breaking `](` keeps the text and the visible URL but
# no renderer turns it into a masked link or a fetched image.
_MARKDOWN_LINK = re.compile(r"\](?=\()")


def strip_control(text: str) -> str:
    """Remove escape sequences and control characters; keep `\\n` and `\\t` (a lone `\\r` becomes `\\n`)."""
    text = _LINE_BREAKS.sub("\n", text)
    text = _ESCAPE_SEQUENCES.sub("", text)
    # A lone surrogate is shown as the replacement character rather than dropped: the name stays recognisable.
    text = re.sub("[\ud800-\udfff]", "\ufffd", text)
    return _CONTROL.sub("", text)


def quote_safe(text: str) -> str:
    """`strip_control`, then neutralise mentions, channel/user links and markdown links/images (shown literally)."""
    text = strip_control(text)
    text = _ANGLE_MARKUP.sub("<" + ZERO_WIDTH_SPACE, text)
    text = _AT_MENTION.sub("@" + ZERO_WIDTH_SPACE, text)
    return _MARKDOWN_LINK.sub("]" + ZERO_WIDTH_SPACE, text)
