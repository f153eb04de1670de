"""The SQL of conversation memory: turns and rolling summaries, always read within one conversation id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from db.engine import read_rows
from knowledge.storage.words import lexical_text, word_text


@dataclass(frozen=True)
class StoredTurn:
    id: int
    question: str
    standalone_query: str
    answer: str
    cited_chunk_ids: tuple[int, ...]
    asker: str | None


@dataclass(frozen=True)
class StoredSummary:
    text: str
    through_turn_id: int


async def record_turn(
    conn: AsyncConnection, conversation_id: str, *, question: str, standalone_query: str, answer: str,
    principals: Sequence[str], asker: str | None, cited_chunk_ids: Sequence[int],
    context_chunk_ids: Sequence[int] = (), history_turn_ids: Sequence[int] = (), summary_through: int = 0,
) -> int:
    """Store a turn. Its context is every chunk its prompt held (`context_chunk_ids`) plus, transitively, the
    context of the earlier turns its history showed (`history_turn_ids`, and every turn up to `summary_through`
    when a summary was shown): the answer may restate any of them, cited or not."""
    return int((
        await conn.execute(
            text(
                "INSERT INTO conversation_turns (conversation_id, question, standalone_query, answer, principals, "
                "asker, cited_chunk_ids, context_chunk_ids) VALUES (:c, :q, :s, :a, :p, :asker, "
                "CAST(:chunks AS bigint[]), ARRAY("
                "  SELECT DISTINCT x FROM ("
                "    SELECT unnest(CAST(:context AS bigint[])) AS x UNION ALL SELECT unnest(CAST(:chunks AS bigint[]))"
                "    UNION ALL SELECT unnest(coalesce(t.context_chunk_ids, t.cited_chunk_ids)) FROM conversation_turns t"
                "    WHERE t.conversation_id = :c AND (t.id = ANY(CAST(:hist AS bigint[])) OR t.id <= :through)"
                "  ) AS all_chunks WHERE x IS NOT NULL ORDER BY x)) RETURNING id"
            ),
            {"c": conversation_id, "q": question, "s": standalone_query, "a": answer, "p": list(principals),
             "asker": asker, "chunks": list(cited_chunk_ids), "context": list(context_chunk_ids),
             "hist": list(history_turn_ids), "through": summary_through},
        )
    ).scalar_one())


async def turns_after(conn: AsyncConnection, conversation_id: str, after_id: int = 0) -> list[StoredTurn]:
    """The conversation's turns with id > after_id, oldest first. Turns stored before migration 0002 have no
    standalone query: the question stands in for it."""
    rows = await conn.execute(
        text(
            "SELECT id, question, coalesce(standalone_query, question) AS standalone_query, answer, "
            "cited_chunk_ids, asker FROM conversation_turns WHERE conversation_id = :c AND id > :after ORDER BY id"
        ),
        {"c": conversation_id, "after": after_id},
    )
    return [
        StoredTurn(r.id, r.question, r.standalone_query, r.answer, tuple(r.cited_chunk_ids or ()), r.asker)
        for r in rows
    ]


async def load_summary(conn: AsyncConnection, conversation_id: str) -> StoredSummary | None:
    row = (
        await conn.execute(
            text("SELECT summary, through_turn_id FROM conversation_summaries WHERE conversation_id = :c"),
            {"c": conversation_id},
        )
    ).first()
    return StoredSummary(row.summary, row.through_turn_id) if row else None


async def save_summary(conn: AsyncConnection, conversation_id: str, summary: str, through_turn_id: int) -> None:
    """Store the summary unless a concurrent fold already covered more turns (the newest summary wins)."""
    await conn.execute(
        text(
            "INSERT INTO conversation_summaries (conversation_id, summary, through_turn_id) VALUES (:c, :s, :t) "
            "ON CONFLICT (conversation_id) DO UPDATE SET summary = EXCLUDED.summary, "
            "through_turn_id = EXCLUDED.through_turn_id, updated_at = now() "
            "WHERE conversation_summaries.through_turn_id < EXCLUDED.through_turn_id"
        ),
        {"c": conversation_id, "s": summary, "t": through_turn_id},
    )


async def rarest_term_fraction(conn: AsyncConnection, text_: str, config: str) -> float | None:
    """The fraction of indexed chunks that hold the text's rarest (stemmed) term; None if no term is indexed."""
    return (
        await conn.execute(
            text(
                "SELECT min(l.df::float8 / greatest(s.n_chunks, 1)) FROM lexemes l, corpus_stats s "
                "WHERE s.id = 1 AND l.df > 0 "
                "AND l.lexeme = ANY(tsvector_to_array(to_tsvector(CAST(:config AS regconfig), :text)))"
            ),
            {"config": config, "text": lexical_text(text_)},
        )
    ).scalar()


async def turns_hidden_from(conn: AsyncConnection, conversation_id: str, principals: Sequence[str]) -> set[int]:
    """Turns of the conversation whose prompt held a chunk these principals may not see now, or one that no longer
    exists (its document changed or was removed: what it said cannot be checked, so it counts as hidden). The
    prompt's chunks (`context_chunk_ids`), not only the cited ones: an answer may restate a passage it did not cite.
    Turns stored before that column existed fall back to their cited chunks, and are hidden as well from anyone
    who does not hold every principal they were answered for (what else their prompt held is unknown). A turn
    whose prompt held no chunk (an abstention before generation) is never hidden."""
    rows = await conn.execute(
        text(
            "SELECT t.id FROM conversation_turns t WHERE t.conversation_id = :c AND ("
            "  (t.context_chunk_ids IS NULL AND NOT (t.principals <@ CAST(:p AS text[])))"
            "  OR EXISTS (SELECT 1 FROM unnest(coalesce(t.context_chunk_ids, t.cited_chunk_ids)) AS used(id) "
            "             LEFT JOIN chunks ch ON ch.id = used.id "
            "             WHERE ch.id IS NULL OR NOT (ch.access && CAST(:p AS text[]))))"
        ),
        {"c": conversation_id, "p": list(principals)},
    )
    return {int(r.id) for r in rows}


async def delete_turns_older_than(conn: AsyncConnection, days: int) -> int:
    """Retention: turns older than `days`, and the summary of every conversation that lost a turn. A summary folds
    a conversation's oldest turns (and, at id 0, the thread messages read before its first turn), and retention
    deletes the oldest turns first: a summary is never left quoting a deleted turn. The memory folds the turns that
    remain into a new summary once they pass the budget again (`Memory.history`)."""
    turns = (
        await conn.execute(
            text(
                "WITH gone AS (DELETE FROM conversation_turns WHERE created_at < now() - make_interval(days => :d) "
                "              RETURNING conversation_id), "
                "     dropped AS (DELETE FROM conversation_summaries s WHERE s.conversation_id IN "
                "                 (SELECT conversation_id FROM gone) RETURNING 1) "
                "SELECT (SELECT count(*) FROM gone) AS turns, (SELECT count(*) FROM dropped) AS summaries"
            ),
            {"d": days},
        )
    ).one().turns
    await conn.execute(
        text(
            "DELETE FROM conversation_summaries s WHERE NOT EXISTS "
            "(SELECT 1 FROM conversation_turns t WHERE t.conversation_id = s.conversation_id)"
        )
    )
    return int(turns)


async def delete_turn(conn: AsyncConnection, turn_id: int) -> None:
    """One turn, and its conversation's summary if that folded it."""
    await conn.execute(
        text(
            "WITH gone AS (DELETE FROM conversation_turns WHERE id = :t RETURNING conversation_id, id) "
            "DELETE FROM conversation_summaries s USING gone "
            "WHERE s.conversation_id = gone.conversation_id AND s.through_turn_id >= gone.id"
        ),
        {"t": turn_id},
    )


async def delete_turns_of(conn: AsyncConnection, askers: Sequence[str], principals: Sequence[str] = ()) -> tuple[int, int]:
    """A person's turns (by their platform identities), and the summaries of every conversation they took part in
    (a summary may retell what they said); their principals (`user:<email>`) are also removed from the audience
    recorded on other people's turns. Returns (turns, summaries) deleted."""
    ids = list(askers)
    conversations = list(
        (
            await conn.execute(
                text("SELECT DISTINCT conversation_id FROM conversation_turns WHERE asker = ANY(CAST(:a AS text[]))"),
                {"a": ids},
            )
        ).scalars()
    )
    turns = (
        await conn.execute(text("DELETE FROM conversation_turns WHERE asker = ANY(CAST(:a AS text[]))"), {"a": ids})
    ).rowcount or 0
    summaries = (
        await conn.execute(
            text("DELETE FROM conversation_summaries WHERE conversation_id = ANY(CAST(:c AS text[]))"),
            {"c": conversations},
        )
    ).rowcount or 0
    for principal in principals:
        await conn.execute(
            text("UPDATE conversation_turns SET principals = array_remove(principals, :p) WHERE :p = ANY(principals)"),
            {"p": principal},
        )
    return turns, summaries


@dataclass(frozen=True)
class TermStat:
    lexeme: str
    df: int  # indexed chunks holding the term (0: none does)
    n_chunks: int
    in_passages: tuple[bool, ...]  # for each passage asked about, whether it holds the term


# For each (stemmed) term of the question, then of the named words: how many indexed chunks hold it, and for each
# passage whether it holds it. Each passage is tokenised once (MATERIALIZED), not once per term.
_TERM_STATISTICS = text(
    "WITH p AS MATERIALIZED ("
    "    SELECT i, tsvector_to_array(to_tsvector(CAST(:config AS regconfig), p)) AS lex"
    "    FROM unnest(CAST(:passages AS text[])) WITH ORDINALITY AS t(p, i)), "
    "q AS (SELECT 0 AS part, lexeme, n"
    "      FROM unnest(tsvector_to_array(to_tsvector(CAST(:config AS regconfig), :question))) WITH ORDINALITY AS t(lexeme, n)"
    "      UNION ALL "
    "      SELECT 1, lexeme, n"
    "      FROM unnest(tsvector_to_array(to_tsvector(CAST(:config AS regconfig), :named))) WITH ORDINALITY AS t(lexeme, n)) "
    "SELECT q.part, q.lexeme, coalesce(l.df, 0) AS df, s.n_chunks, ARRAY(SELECT q.lexeme = ANY(p.lex) FROM p ORDER BY p.i) "
    "FROM q CROSS JOIN corpus_stats s LEFT JOIN lexemes l ON l.lexeme = q.lexeme WHERE s.id = 1 ORDER BY q.part, q.n"
)


async def _term_statistics(conn: AsyncConnection, question: str, named: str, passages: Sequence[str],
                           config: str) -> tuple[list[TermStat], list[TermStat]]:
    """The rows of _TERM_STATISTICS for an already tokenised question and named words, split by part."""
    rows = await read_rows(conn, _TERM_STATISTICS, {
        "config": config, "question": question, "named": named, "passages": [lexical_text(p) for p in passages]})
    stats: tuple[list[TermStat], list[TermStat]] = ([], [])
    for row in rows:
        stats[row[0]].append(TermStat(row[1], int(row[2]), int(row[3]), tuple(row[4])))
    return stats


async def term_statistics(conn: AsyncConnection, question: str, passages: Sequence[str], config: str, *,
                          words_only: bool = False) -> list[TermStat]:
    """For each (stemmed) term of the question: how many indexed chunks hold it and, for each passage, whether the
    passage holds it. One round trip; the follow-up decision reads the index's own statistics instead of word
    lists. `words_only`: a Chinese or Japanese question's terms are its words, not also its character bigrams
    (`words.word_text`)."""
    stats, _ = await _term_statistics(conn, word_text(question) if words_only else lexical_text(question), "",
                                      passages, config)
    return stats


async def evidence_term_statistics(conn: AsyncConnection, question: str, named: str, passages: Sequence[str],
                                   config: str) -> tuple[list[TermStat], list[TermStat]]:
    """`term_statistics` of the question's words (`words_only`) and of its named words (`named`; "" for none)
    against the same passages, in one statement: the answer's evidence needs both, and the passages (whole
    documents among them) are tokenised once for the two."""
    return await _term_statistics(conn, word_text(question), lexical_text(named) if named else "", passages, config)


async def best_chunk_coverage(conn: AsyncConnection, question: str, config: str, scan: int = 2000) -> float:
    """The largest idf-weighted share of the question's terms that any one indexed chunk holds (0..1): whether
    the question's own words find a confident hit, without the conversation. Candidates are the chunks holding
    one of its terms (at most `scan`, rarest terms' chunks first by GIN order is not guaranteed; enough here)."""
    value = (
        await conn.execute(
            text(
                "WITH q AS (SELECT DISTINCT t.lexeme, coalesce(l.df, 0) AS df, s.n_chunks AS n "
                "           FROM unnest(tsvector_to_array(to_tsvector(CAST(:config AS regconfig), :question))) AS t(lexeme) "
                "           CROSS JOIN corpus_stats s LEFT JOIN lexemes l ON l.lexeme = t.lexeme WHERE s.id = 1), "
                "w AS (SELECT lexeme, ln((n - df + 0.5) / (df + 0.5) + 1.0) AS idf FROM q), "
                "cand AS (SELECT tsvector_to_array(c.tsv) AS lex FROM chunks c "
                "         WHERE c.tsv @@ CAST((SELECT string_agg(quote_literal(lexeme), ' | ') FROM w) AS tsquery) "
                "         LIMIT :scan) "
                "SELECT coalesce(max((SELECT sum(idf) FROM w WHERE w.lexeme = ANY(cand.lex))), 0) "
                "       / nullif((SELECT sum(idf) FROM w), 0) FROM cand"
            ),
            {"config": config, "question": lexical_text(question), "scan": scan},
        )
    ).scalar()
    return float(value or 0.0)


async def cited_titles(conn: AsyncConnection, chunk_ids: Sequence[int]) -> list[str]:
    """The titles of the documents these chunks belong to, in the order first cited (what "that document" or "there"
    in the next question may mean)."""
    if not chunk_ids:
        return []
    rows = await conn.execute(
        text("SELECT d.title FROM unnest(CAST(:ids AS bigint[])) WITH ORDINALITY AS x(id, i) "
             "JOIN chunks c ON c.id = x.id JOIN documents d ON d.id = c.document_id ORDER BY x.i"),
        {"ids": list(chunk_ids)},
    )
    titles: list[str] = []
    for row in rows:
        if row.title not in titles:
            titles.append(row.title)
    return titles
