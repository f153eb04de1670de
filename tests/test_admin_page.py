"""The admin page in a real headless browser (Debian's chromium driven by Playwright): it renders its sections and
SVG charts, a wrong token gets 401, it is not served at all without ADMIN_TOKEN, and every value is escaped.
The test writes a screenshot (to its tmp dir, and to RAGBOT_SCREENSHOT_DIR when set) for humans to look at."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import aiohttp
import pytest
from conftest import write

from bot.app import BotApp
from bot.chat.feedback import remember_answer
from bot.chat.state import BotState
from bot.settings import BotSettings
from knowledge.sources.folder import FolderSource

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "adm-7c1f0e9b5d2a4e8f"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
HOSTILE = "<script>alert('x')</script> How do I expense a <b>boat</b>?"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium for the admin page test: sudo apt-get install "
                                "chromium (make test installs it when run as root)")


async def _populated_kb(kb_factory, tmp_path: Path):
    write(tmp_path / "docs", "vacation.md", "# Vacation policy\n\nFull-time employees get 25 days of paid vacation "
                                            "per year.\n")
    kb = await kb_factory()
    assert not (await kb.sync(FolderSource(tmp_path / "docs", "handbook"))).failed
    asked = [("How many vacation days do full-time employees get?", "slack:T1:C1", False),
             ("What is the airspeed velocity of an unladen swallow?", "slack:T1:C1", False),
             (HOSTILE, None, True)]
    for i, (question, channel, private) in enumerate(asked):
        answer = await kb.answer(question, ["everyone"], f"slack:T1:C1:{i}", asker="slack:UANN")
        answer_id = await remember_answer(BotState(kb.engine), platform="slack", conversation_id=f"slack:T1:C1:{i}", asker="slack:UANN",
                                          question=question, answer=answer, channel_key=channel, private=private)
        await BotState(kb.engine).record_feedback(answer_id, "slack:UBOB", "down" if i else "up")
    # Access changes (issue 38): one by an operator (the CLI), one a workspace admin was refused.
    from bot.chat.admin import PLATFORM_ADMIN, Grantor, users_map
    await users_map(BotState(kb.engine), "slack:UBOB", "group:finance")
    await users_map(BotState(kb.engine), "slack:UEVE", "group:hr", Grantor("slack:UEVE", PLATFORM_ADMIN, ("everyone",)))
    return kb


def settings(**overrides: object) -> BotSettings:
    return BotSettings(_env_file=None, host="127.0.0.1", port=0, run_scheduler=False, **overrides)  # type: ignore[call-arg]


async def test_the_admin_page_renders_with_charts_in_a_browser_and_refuses_a_wrong_token(kb_factory, tmp_path) -> None:
    from playwright.async_api import async_playwright

    kb = await _populated_kb(kb_factory, tmp_path)
    app = BotApp(settings(admin_token=TOKEN), kb=kb, adapters=[])
    await app.start()
    base = f"http://127.0.0.1:{app.port}/admin"
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = await browser.new_page(viewport={"width": 1200, "height": 900})
            dialogs: list[str] = []
            page.on("dialog", lambda d: dialogs.append(d.message))

            wrong = await page.goto(f"{base}?token=not-the-token")
            assert wrong is not None and wrong.status == 401
            missing = await page.goto(base)
            assert missing is not None and missing.status == 401

            response = await page.goto(f"{base}?token={TOKEN}")
            assert response is not None and response.status == 200
            assert response.headers["cache-control"] == "no-store"
            assert "script-src" not in response.headers["content-security-policy"]  # default-src 'none': no scripts
            assert await page.title() == "ragbot admin"
            for section in ("Activity", "Sources", "Sync history", "Gaps", "Documents", "Feedback", "Audit log"):
                assert await page.locator(f"section h2:text-is('{section}')").count() == 1, section
            assert await page.locator("svg#questions-per-day rect.bar").count() == 30
            assert await page.locator("svg#answer-rate rect.bar").count() == 30
            today_bar = page.locator("svg#questions-per-day rect.bar").last
            assert float(await today_bar.get_attribute("height")) > 0  # today's 3 questions are drawn
            body = await page.locator("body").inner_text()
            assert "handbook" in body and "ok" in body  # the source and its last run
            assert "unladen swallow" in body  # a declined question, as a gap
            audit = await page.locator("section#audit tr").all_text_contents()
            assert any("cli" in row and "slack:UBOB" in row and "group:finance" in row and "done" in row
                       for row in audit)
            assert any("slack:UEVE" in row and "platform-admin" in row and "group:hr" in row and "refused" in row
                       for row in audit)
            assert HOSTILE in body  # shown as text, never run or parsed as markup
            assert dialogs == [] and await page.locator("script, details.gap li b, td b").count() == 0
            gap_items = await page.locator("details.gap li").all_text_contents()  # inside closed <details>
            assert any("swallow" in item and "slack:UANN" in item for item in gap_items)  # a channel's asker...
            hostile_item = next(item for item in gap_items if "boat" in item)
            assert "private conversation" in hostile_item and "UANN" not in hostile_item  # ...a DM's does not
            assert TOKEN not in await page.content()

            shot = tmp_path / "admin-page.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get("RAGBOT_SCREENSHOT_DIR"):
                target = Path(os.environ["RAGBOT_SCREENSHOT_DIR"])
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(shot, target / "admin-page.png")
            await browser.close()

        async with aiohttp.ClientSession() as http:
            bearer = await http.get(base, headers={"Authorization": f"Bearer {TOKEN}"})
            assert bearer.status == 200
            posted = await http.post(base, headers={"Authorization": f"Bearer {TOKEN}"})
            assert posted.status == 405  # read-only
    finally:
        await app.stop()


async def test_without_admin_token_there_is_no_admin_page(kb_factory) -> None:
    kb = await kb_factory()
    app = BotApp(settings(), kb=kb, adapters=[])
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            for url in (f"http://127.0.0.1:{app.port}/admin", f"http://127.0.0.1:{app.port}/admin?token="):
                assert (await http.get(url)).status == 404
            assert (await http.get(f"http://127.0.0.1:{app.port}/healthz")).status == 200
    finally:
        await app.stop()
