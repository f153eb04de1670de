"""How fast the Discord bot acknowledges and answers `/ask`. Prints numbers; asserts nothing.

    .venv/bin/python bench/discord_bench.py [--questions 30]

The real discord.py client and command tree run against the fake Discord API of the test suite (tests/fakes/) on
127.0.0.1, over the example handbook, answering offline (extractive). For each question: the time from the
INTERACTION_CREATE payload to the defer reaching "Discord" (Discord's limit is 3 s) and to the answer's last
follow-up, and the REST calls one answer costs. Uses DATABASE_URL if set, else a throwaway embedded Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not os.environ.get("DATABASE_URL"):
    os.environ["RAGBOT_HOME"] = tempfile.mkdtemp(prefix="ragbot-bench-")
os.environ["ANTHROPIC_API_KEY"] = ""
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakes.discord_api import FakeDiscordAPI  # noqa: E402
from fakes.discord_gateway import DiscordHarness  # noqa: E402

from bot.discord.adapter import RagbotDiscord, configure_api_url  # noqa: E402
from bot.settings import BotSettings  # noqa: E402
from knowledge.eval.evaluation import load_jsonl_questions  # noqa: E402
from knowledge.kb import KnowledgeBase  # noqa: E402
from knowledge.sources.folder import FolderSource  # noqa: E402

HANDBOOK = ROOT / "examples" / "handbook"
GUILD, CHANNEL, USER = 800000000000000001, 800000000000000002, 800000000000000003


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms   max {ordered[-1]:7.1f} ms   (n={len(ordered)})"


async def main(n_questions: int) -> None:
    kb = await KnowledgeBase.open()
    try:
        if not await kb.source_names():
            await kb.sync(FolderSource(HANDBOOK, "handbook"))
        questions = [q.question for q in load_jsonl_questions(HANDBOOK / "eval.jsonl")][:n_questions]
        async with FakeDiscordAPI() as fake:
            configure_api_url(fake.base_url)
            settings = BotSettings(_env_file=None, discord_bot_token=fake.token, discord_guild_id=GUILD)  # type: ignore[call-arg]
            bot = RagbotDiscord(kb, settings)
            await bot.login(fake.token)
            harness = DiscordHarness(bot, fake)
            harness.guild_create(GUILD, [CHANNEL])
            await harness.slash("ask", [{"type": 3, "name": "question", "value": "warm-up"}], guild_id=GUILD,
                                channel_id=CHANNEL, user_id=USER)
            to_defer, to_answer, calls = [], [], []
            for question in questions:
                before = len(fake.calls)
                started = time.perf_counter()
                payload = await harness.slash("ask", [{"type": 3, "name": "question", "value": question}],
                                              guild_id=GUILD, channel_id=CHANNEL, user_id=USER)
                mine = [c for c in fake.calls[before:] if payload["token"] in c.path]
                to_defer.append((mine[0].at - started) * 1000)
                to_answer.append((mine[-1].at - started) * 1000)
                calls.append(len(fake.calls) - before)
            await bot.close()
    finally:
        await kb.close()
    print(f"/ask over the handbook, offline answers, {len(questions)} questions")
    print(f"  interaction → defer sent      {percentiles(to_defer)}")
    print(f"  interaction → answer posted   {percentiles(to_answer)}")
    print(f"  REST calls per answer         {statistics.mean(calls):.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=30)
    asyncio.run(main(parser.parse_args().questions))
