"""The index's term statistics that the answer's evidence and the follow-up decision read: for each term of a
question (and of its named words), how many indexed chunks hold it, and whether each passage holds it. One statement
gives both lists and tokenises each passage once; its rows must be what the index and the passages say term by term,
in the question's order, for English and Chinese questions, with and without named words.

Real Postgres: the example handbook's index (its lexemes and corpus statistics).
"""

from __future__ import annotations

from sqlalchemy import text

from knowledge.answer.generators import extractive
from knowledge.storage.conversations import TermStat, evidence_term_statistics, term_statistics
from knowledge.storage.words import lexical_text, word_text

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


async def _lexemes(conn, config: str, tokenised: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The lexemes Postgres makes of already tokenised text, in tsvector order."""
    return list((await conn.execute(text("SELECT tsvector_to_array(to_tsvector(CAST(:c AS regconfig), :t))"),
                                    {"c": config, "t": tokenised})).scalar_one())


async def _expected(conn, config: str, tokenised_question: str) -> list[TermStat]:  # type: ignore[no-untyped-def]
    """The rows read term by term: each lexeme's df from the vocabulary, the corpus size, each passage's lexemes."""
    n_chunks = (await conn.execute(text("SELECT n_chunks FROM corpus_stats WHERE id = 1"))).scalar_one()
    passages = [set(await _lexemes(conn, config, lexical_text(p))) for p in PASSAGES]
    rows = []
    for lexeme in await _lexemes(conn, config, tokenised_question):
        df = (await conn.execute(text("SELECT df FROM lexemes WHERE lexeme = :l"), {"l": lexeme})).scalar()
        rows.append(TermStat(lexeme, int(df or 0), int(n_chunks), tuple(lexeme in p for p in passages)))
    return rows


async def test_the_term_statistics_are_what_the_index_and_the_passages_say(handbook_kb) -> None:
    config = handbook_kb.settings.text_search_config
    held = 0
    async with handbook_kb.search_engine.connect() as conn:
        for question in QUESTIONS:
            specific = extractive.specific_words(question)
            words = extractive.content_text(question)
            named = " ".join(specific)
            expected_words = await _expected(conn, config, word_text(words))
            expected_named = await _expected(conn, config, lexical_text(named)) if specific else []
            stats, named_stats = await evidence_term_statistics(conn, words, named, PASSAGES, config)
            assert stats == expected_words, question
            assert named_stats == expected_named, question
            assert stats, question  # every question here has words the statistics cover
            # the follow-up decision's reading: the same statement, one list
            assert await term_statistics(conn, words, PASSAGES, config, words_only=True) == expected_words
            assert await term_statistics(conn, question, [], config) == [
                TermStat(s.lexeme, s.df, s.n_chunks, ()) for s in await _expected(conn, config, lexical_text(question))]
            held += sum(any(s.in_passages) for s in stats)
    assert held, "some question terms are in the passages"
    assert any(extractive.specific_words(q) for q in QUESTIONS)
    assert not extractive.specific_words(QUESTIONS[2])
