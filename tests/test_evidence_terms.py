"""The answer's evidence reads the index's term statistics of a question's words and of its named words in one
statement (`evidence_term_statistics`, which tokenises each passage once) instead of two `term_statistics` calls:
the rows must be the same, in the same order, for English and Chinese questions, with and without named words.

Real Postgres: the example handbook's index (its lexemes and corpus statistics).
"""

from __future__ import annotations

from knowledge.answer.generators import extractive
from knowledge.storage.conversations import evidence_term_statistics, term_statistics

PASSAGES = [
    "Paid time off. Full-time employees get 15 days of PTO in their first year, 20 days from the third year.",
    "Parental leave at Northwind: 16 weeks of paid leave for every new parent, taken within the first year.",
    "全职员工第一年有十五天带薪年假。",
    "",
]
QUESTIONS = [
    "How many PTO days do I get in my first year?",
    "How many weeks of paid parental leave does Northwind offer?",
    "How many sick days do we get per year?",  # no named word
    "全职员工第一年有多少天年假？",
    "Does Zorblax cover the Quuxcorp VPN?",  # named words the index does not hold
]


async def test_one_statement_gives_the_rows_of_the_two_it_replaces(handbook_kb) -> None:
    config = handbook_kb.settings.text_search_config
    async with handbook_kb.search_engine.connect() as conn:
        for question in QUESTIONS:
            specific = extractive.specific_words(question)
            words = extractive.content_text(question)
            expected_stats = await term_statistics(conn, words, PASSAGES, config, words_only=True)
            expected_named = await term_statistics(conn, " ".join(specific), PASSAGES, config) if specific else []
            stats, named = await evidence_term_statistics(conn, words, " ".join(specific), PASSAGES, config)
            assert stats == expected_stats, question
            assert named == expected_named, question
            assert stats, question  # every question here has words the statistics cover
    assert any(extractive.specific_words(q) for q in QUESTIONS)
    assert not extractive.specific_words(QUESTIONS[2])
