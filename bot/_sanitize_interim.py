"""Stand-in for `knowledge.sanitize.quote_safe` (issue 12) until that module is merged into this branch; removed
then. Same contract: strip control characters (keep \\n and \\t) and neutralise mention syntax."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MENTION = re.compile(r"<(?=[!@#])")
_AT = re.compile(r"@(?=(everyone|here|channel)\b)", re.IGNORECASE)
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]*)\)")


def strip_control(text: str) -> str:
    return _CONTROL.sub("", text)


def quote_safe(text: str) -> str:
    text = strip_control(text)
    text = _MENTION.sub("<\u200b", text)
    text = _AT.sub("@\u200b", text)
    return _IMAGE.sub(r"[\1](\2)", text)
