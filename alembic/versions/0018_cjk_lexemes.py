"""Chinese and Japanese chunks re-tokenised into words and character bigrams, in the one BM25 model.

Before: chunks were tokenised by the text search configuration alone, which splits on spaces and punctuation; a
Chinese or Japanese sentence (no spaces) became one lexeme, which no question ever matched: BM25 found nothing.

After: `knowledge.storage.words.lexical_text` rewrites each CJK run as its words (jieba, janome) and its character
bigrams before Postgres tokenises it, at write time (store.write_documents) and for every question. This migration
re-tokenises the chunks already indexed that hold CJK characters (in their title, heading or text): their tsvector,
length and term-frequency tiers are rebuilt, the vocabulary's document frequencies and the corpus' total length are
moved by the difference, and their BM25 weights recomputed, so a mixed corpus keeps one statistics table. Chunks
without CJK characters are not touched (their lexemes do not change). The downgrade tokenises those chunks as before.

The text search configuration is the one set for the index (TEXT_SEARCH_CONFIG, default english).

Revision ID: 0018_cjk_lexemes
Revises: 0017_leases
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.engine import Connection

from alembic import op

revision = "0018_cjk_lexemes"
down_revision = "0017_leases"
branch_labels = None
depends_on = None

# Any Han, hiragana or katakana character (as knowledge.storage.words.CJK_RUN).
_CJK = "[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\u31f0-\u31ff]"
_BATCH = 500


def _config() -> str:
    from knowledge.settings import KnowledgeSettings

    return KnowledgeSettings().text_search_config


def _reindex(bind: Connection, tokenise: Callable[[str], str]) -> None:
    from knowledge.ingest.chunking import compose_search_text

    rows = bind.execute(
        text("SELECT c.id, d.title, c.heading, c.text FROM chunks c JOIN documents d ON d.id = c.document_id "
             "WHERE c.text ~ :cjk OR c.heading ~ :cjk OR d.title ~ :cjk ORDER BY c.id"),
        {"cjk": _CJK},
    ).all()
    if not rows:
        return
    config = _config()
    bind.execute(text("ALTER TABLE chunks DISABLE TRIGGER chunks_immutable"))
    for start in range(0, len(rows), _BATCH):
        batch = rows[start:start + _BATCH]
        ids = [r.id for r in batch]
        bodies = [tokenise(compose_search_text(r.title, r.heading or "", r.text)) for r in batch]
        params = {"ids": ids}
        old_len = bind.execute(text("SELECT coalesce(sum(lexical_len), 0) FROM chunks WHERE id = ANY(:ids)"),
                               params).scalar_one()
        bind.execute(text(
            "UPDATE lexemes l SET df = l.df - d.n FROM (SELECT t.lexeme, count(*) AS n FROM chunks c, unnest(c.tsv) t "
            "WHERE c.id = ANY(:ids) GROUP BY t.lexeme ORDER BY t.lexeme) d WHERE l.lexeme = d.lexeme"), params)
        bind.execute(text(
            "UPDATE chunks c SET tsv = to_tsvector(CAST(:config AS regconfig), x.body) "
            "FROM unnest(CAST(:ids AS bigint[]), CAST(:bodies AS text[])) AS x(id, body) WHERE c.id = x.id"),
            {**params, "config": config, "bodies": bodies})
        bind.execute(text(
            "UPDATE chunks c SET lexical_len = (SELECT coalesce(sum(coalesce(array_length(t.positions, 1), 1)), 0) "
            "FROM unnest(c.tsv) t), tf_tiers = bm25_tf_tiers(c.tsv) WHERE c.id = ANY(:ids)"), params)
        bind.execute(text(
            "INSERT INTO lexemes (lexeme, df) SELECT t.lexeme, count(*) FROM chunks c, unnest(c.tsv) t "
            "WHERE c.id = ANY(:ids) GROUP BY t.lexeme ORDER BY t.lexeme "
            "ON CONFLICT (lexeme) DO UPDATE SET df = lexemes.df + EXCLUDED.df"), params)
        bind.execute(text(
            "UPDATE corpus_stats SET total_len = total_len - :old "
            "+ (SELECT coalesce(sum(lexical_len), 0) FROM chunks WHERE id = ANY(:ids)) WHERE id = 1"),
            {**params, "old": old_len})
        bind.execute(text(
            "UPDATE chunks c SET bm25 = bm25_document_vector(c.tsv, c.lexical_len, s.weights_avgdl, s.k1, s.b), "
            "bm25_avgdl = s.weights_avgdl FROM corpus_stats s WHERE s.id = 1 AND c.id = ANY(:ids)"), params)
    bind.execute(text("ALTER TABLE chunks ENABLE TRIGGER chunks_immutable"))


def upgrade() -> None:
    from knowledge.storage.words import lexical_text

    _reindex(op.get_bind(), lexical_text)


def downgrade() -> None:
    _reindex(op.get_bind(), lambda body: body)
