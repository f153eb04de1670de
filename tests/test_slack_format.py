"""Slack rendering, as a Slack user would read it: the model's Markdown as mrkdwn, document text that can never
ping anyone, the Sources list, long answers split within Slack's limits, and users' messages back to plain text."""

from __future__ import annotations

import re

from bot.chat.render import SourceEntry
from bot.slack.format import (
    SECTION_LIMIT,
    answer_messages,
    question_text,
    sources_mrkdwn,
    stream_safe,
    to_mrkdwn,
)

ZWSP = "\u200b"


def test_markdown_becomes_mrkdwn() -> None:
    markdown = (
        "## **Leave** policy\n"
        "You get **25 days** and *some* ~~fewer~~ extra [1].\n"
        "- first\n"
        "* second\n"
        "> quoted\n"
        "See [the portal](https://hr.example.com/a?b=1&c=2) and `a<b`.\n"
        "```\nx < y && z\n```"
    )
    out = to_mrkdwn(markdown, {1: "https://wiki.example.com/leave"})
    lines = out.splitlines()
    assert lines[0] == "*Leave policy*"
    assert "*25 days*" in out and "_some_" in out and "~fewer~" in out
    assert "<https://wiki.example.com/leave|[1]>" in out
    assert "• first" in lines and "• second" in lines
    assert ">quoted" in lines
    assert "the portal (<https://hr.example.com/a?b=1&amp;c=2>)" in out
    assert "`a&lt;b`" in out
    assert "```\nx &lt; y &amp;&amp; z\n```" in out


def test_document_text_can_never_ping_or_inject_markup() -> None:
    hostile = "Hi <!channel> and <!here|here> and <@U123> and <#C42> and <!subteam^S1> <https://evil.example|safe>"
    out = to_mrkdwn(hostile)
    for live in ("<!channel>", "<!here", "<@U123>", "<#C42>", "<!subteam", "<https://evil"):
        assert live not in out
    assert re.search(r"[<>]", out) is None  # every angle bracket is escaped: nothing parses as Slack markup
    assert "channel" in out and "U123" in out  # still readable
    assert "<!channel>" not in stream_safe("<!channel> now")


def test_masked_links_show_where_they_go() -> None:
    out = to_mrkdwn("[Reset your password](https://evil.example/steal)")
    assert "https://evil.example/steal" in out and "|Reset" not in out
    assert to_mrkdwn("[x](javascript:alert(1))").count("<") == 0


def test_sources_list_links_titles_or_shows_paths() -> None:
    entries = [
        SourceEntry(1, "Leave & <b>", "https://wiki.example.com/leave", "hr/leave.md", "Carry-over"),
        SourceEntry(2, "Notes", None, "team/notes.md", ""),
    ]
    out = sources_mrkdwn(entries)
    assert out.splitlines() == [
        "*Sources*",
        "[1] <https://wiki.example.com/leave|Leave &amp; &lt;b&gt;> › Carry-over",
        "[2] Notes (`team/notes.md`)",
    ]


def test_long_answers_split_within_slack_limits_with_feedback_last() -> None:
    link = "[the handbook](https://wiki.example.com/handbook)"
    text = " ".join(f"Point {i} is in {link} [{i % 4 + 1}]." for i in range(400))
    entries = [SourceEntry(n, f"Doc {n}", f"https://wiki.example.com/{n}", f"d{n}.md", "") for n in range(1, 5)]
    messages = answer_messages(text, entries, answer_id=7)
    blocks = [b for m in messages for b in m.blocks]
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section"]
    assert len(sections) > 5 and all(len(s) <= SECTION_LIMIT for s in sections)
    assert all(len(m.blocks) <= 50 and len(m.text) <= 3000 for m in messages)
    joined = "\n".join(sections)
    assert joined.count("(<https://wiki.example.com/handbook>)") == 400
    assert sum(joined.count(f"|[{n}]>") for n in range(1, 5)) == 400
    assert blocks[-1]["type"] == "context_actions"
    values = {blocks[-1]["elements"][0][k]["value"] for k in ("positive_button", "negative_button")}
    assert values == {"up:7", "down:7"}
    assert sections[-1].startswith("*Sources*")


def test_question_text_undoes_slack_markup() -> None:
    assert question_text("<@UBOT> what about &lt;b&gt; &amp; <https://x.example/a|this page>?", "UBOT") == (
        "what about <b> & this page?"
    )
    assert question_text("<@UBOT|ragbot>   ", "UBOT") == ""
    assert question_text("mail <mailto:a@b.example|a@b.example> please", "UBOT") == "mail a@b.example please"
    assert ZWSP not in question_text("<@UOTHER> knows", "UBOT")
