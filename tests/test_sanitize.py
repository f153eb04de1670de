"""bot/chat/sanitize.py: document text is shown literally on every surface (terminal, Slack, Discord, JSON)."""

from __future__ import annotations

import json

import pytest

from bot.chat.sanitize import ZERO_WIDTH_SPACE, quote_safe, strip_control

ESC = "\x1b"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (f"{ESC}]0;pwned{ESC}\\Title", "Title"),  # OSC window title, ST-terminated
        (f"{ESC}]0;pwned\x07Title", "Title"),  # OSC, BEL-terminated
        (f"before{ESC}[2J{ESC}[Hafter", "beforeafter"),  # clear screen, cursor home
        (f"{ESC}[31;1mred{ESC}[0m", "red"),  # colours
        (f"{ESC}]8;;https://evil.example{ESC}\\link{ESC}]8;;{ESC}\\", "link"),  # OSC 8 hyperlink
        (f"a{ESC}Pq#0;2;0;0;0{ESC}\\b", "ab"),  # DCS (sixel)
        ("a\x9b2Jb", "ab"),  # 8-bit CSI
        ("a\x9d0;t\x07b", "ab"),  # 8-bit OSC
        (f"{ESC}7saved{ESC}8", "saved"),  # save/restore cursor
        ("bell\x07 back\x08space nul\x00 del\x7f", "bell backspace nul del"),
        ("keep\ttabs\nand newlines", "keep\ttabs\nand newlines"),
        ("overwrite\rhidden", "overwrite\nhidden"),  # a lone CR would hide what came before it
        ("windows\r\nline", "windows\nline"),
        ("abc\u202eevil\u202c", "abcevil"),  # bidi override
        ("name-\udcff.md", "name-\ufffd.md"),  # lone surrogate from an undecodable file name
        ("naïve café — 日本語 ✓", "naïve café — 日本語 ✓"),
        (f"unterminated {ESC}]0;title\nnext line", "unterminated \nnext line"),
    ],
)
def test_strip_control(raw: str, shown: str) -> None:
    assert strip_control(raw) == shown


def test_strip_control_output_is_printable_and_encodable() -> None:
    text = "".join(chr(c) for c in range(0, 0x250)) + "\udc80\ud800"
    out = strip_control(text)
    assert all(ch in "\n\t" or ch.isprintable() or ch == "\xad" for ch in out)
    out.encode("utf-8")  # no lone surrogates left: printing and JSON never fail


@pytest.mark.parametrize(
    "markup",
    ["<!channel>", "<!here>", "<!everyone>", "<!subteam^S123|@devs>", "<@U123ABC>", "<@U123|bob>", "<#C042>",
     "<#C042|general>", "<@123456789012345678>", "<@!123456789012345678>", "<@&123456789012345678>",
     "</deploy:123456789012345678>", "<https://evil.example|click here>"],
)
def test_quote_safe_neutralises_angle_markup_but_keeps_the_text(markup: str) -> None:
    out = quote_safe(f"{markup} please read this")
    assert markup not in out
    assert out.replace(ZERO_WIDTH_SPACE, "") == f"{markup} please read this"


@pytest.mark.parametrize("mention", ["@everyone", "@here", "@channel", "@Everyone"])
def test_quote_safe_neutralises_broadcast_mentions(mention: str) -> None:
    out = quote_safe(f"hey {mention}, lunch")
    assert mention not in out
    assert out.replace(ZERO_WIDTH_SPACE, "") == f"hey {mention}, lunch"


def test_quote_safe_leaves_ordinary_text_alone() -> None:
    text = ("Email alice@example.com or @heretic? Use a < b and x > y; see [1] and [2-3]. "
            "C++ <vector> and <div> are fine; 50% of <10 people. Visit https://example.com/x.")
    assert quote_safe(text) == text


def test_quote_safe_breaks_markdown_images_and_masked_links() -> None:
    out = quote_safe("Look ![logo](https://tracker.example/p.gif) and [docs](https://phish.example)")
    assert "](" not in out
    assert out.replace(ZERO_WIDTH_SPACE, "") == "Look ![logo](https://tracker.example/p.gif) and [docs](https://phish.example)"


def test_quote_safe_is_idempotent_and_strips_control() -> None:
    raw = f"{ESC}[2J<!channel> @everyone ![x](y)"
    once = quote_safe(raw)
    assert quote_safe(once) == once
    assert ESC not in once
    # JSON carries the neutralised text: no raw mention survives serialisation.
    dumped = json.dumps({"text": once})
    assert "<!channel>" not in json.loads(dumped)["text"]
