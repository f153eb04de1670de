"""The SQL of retrieval: BM25's candidates and the HNSW search, each filtered by the asker's access inside its scans
(knowledge.search.retrieval keeps the Python around them: the question's parameters, fusion, reranking).

BM25 is computed inside Postgres with nothing beyond pgvector (the design is in knowledge/search/retrieval.py's
docstring); the dense side is pgvector's HNSW over half-precision vectors. Every statement takes the asker's filters
(principals, sources, updated_after) as parameters and checks them inside its scans, and reads what a hit shows with
each candidate. The statements' tuning knobs are `SearchTuning` (a Retriever holds one; tests and benchmarks pass
their own); they arrive as bind parameters (`SearchTuning.params`), so the statements' text never changes. The SQL
comments name them in upper case (CANDIDATE_POSTINGS is `candidate_postings`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from db.engine import read_rows
from db.models import BM25_SPARSE_DIM
from knowledge.storage.words import INDEX_MARKERS, INDEX_SCRIPTS, lexical_text

# The posting budget (SearchTuning.candidate_postings) counts postings in every chunk, also ones the asker may not
# see, so a reader of few documents can find fewer than k candidates among the rarest terms' chunks although more of
# theirs hold the other terms. A lexical-only search that comes back short then looks once more with every question
# term, among the chunks the asker may see (`among_permitted` in lexical_rows; hybrid searches fill k from the
# dense side).
EVERY_TERM = 2**62  # as SearchTuning.rare_term_corpus_size: every term brings candidates


@dataclass(frozen=True)
class SearchTuning:
    """The knobs of the search statements, with the defaults measured by `bench/search.py` (each field's comment
    says how). A frozen value: a Retriever holds one (`KnowledgeBase(..., search_tuning=...)`), tests and benchmarks
    build their own with `SearchTuning(candidate_postings=2, ...)` instead of changing module globals."""

    # Below this many chunks every question term finds BM25 candidates (every term is always scored).
    rare_term_corpus_size: int = 10_000
    # Above it, candidates come from the question's rarest terms: terms in order of document frequency while their
    # posting lists add up to at most this many chunks (the rarest term always). Common terms still count in every
    # candidate's score; they just do not each bring thousands of candidates that would all have to be scored. Measured
    # at 100k chunks by `bench/search.py --levers` (recall@10 against exact BM25 beside the latency).
    candidate_postings: int = 3_000
    # At most this many candidate chunks are scored, whatever the terms: a question made only of words found in most
    # chunks cannot make a search score the whole corpus (the rows scored are then the first ones found). A common term
    # read through the GIN index brings all its chunks, at most common_index_df (below).
    candidate_scan_cap: int = 10_000
    # The best BM25 matches often lack the rarest question term but hold two of the others (at a million chunks, about
    # a quarter of the exact top-10 were missed without them). So candidates also come from the chunks holding both terms
    # of a pair of the other question terms, for every pair whose expected chunks in common (n × the two terms' shares,
    # were they independent) are at most together_postings, and whose terms are each in at most together_max_df chunks
    # (a longer posting list costs more to read than its pairs bring). At most together_cap such candidates are scored.
    # Each pair is decided by its own two terms alone, and the chunks it brings are checked for access row by row before
    # the cap: a term found only in chunks the asker may not see brings nothing and displaces nothing, without a
    # visibility check per term. Measured by `bench/search.py` (lexical recall@10 against exact BM25).
    # A short question of fairly common words has no such pair (at a million chunks, terms in 25,000, 130,000 and
    # 135,000 chunks: any two share about 3,000 chunks, all three about 450), and its best matches hold all its terms.
    # So triples of terms count too, when none of their pairs qualifies, their expected chunks in common are at most
    # together_postings, and each term is in at most together_triple_max_df chunks (GIN intersects the three lists
    # skipping through the longer ones: about 8–10 ms for those at a million chunks). Groups are read the most selective
    # first, and decided, like pairs, by their own terms alone.
    # The groups are read only from together_corpus_size chunks, where candidate_postings is at most 1% of the corpus; in
    # a smaller one the rarest terms' postings reach far enough down without them. Measured on the bench's 100,000-chunk
    # index (3%), 200 questions, the two versions alternating (and which goes first): the lexical statement's p95 without
    # the groups 9.4 ms instead of 15.5 for a reader of 10% of the documents, 13.8 instead of 17.5 for everyone;
    # recall@10 against exact BM25 0.994 without, 1.0 with them (50 questions). At a million chunks (0.3%) they took
    # recall@10 from 0.73 to 0.87.
    together_corpus_size: int = 300_000
    together_postings: int = 1_000
    together_max_df: int = 50_000
    together_triple_max_df: int = 200_000
    together_cap: int = 1_000
    # Common terms are looked for among the first common_probe_rows chunks (in id order, so every search reads the
    # same ones) before the GIN index. When no question term is rare, candidates are the chunks holding the rarest term:
    # all of them, through the GIN index, while it is in at most common_index_df chunks (reading a posting list costs
    # about 0.2 µs a posting, 4 ms at that bound; the scan cap does not cut such a list short, since where it cut was
    # arbitrary: at a million chunks two of 40 questions lost their best matches to it, recall@10 against exact BM25
    # 0.957 -> 0.972, the lexical statement's mean within 1.5 ms in two alternating runs of 100 questions); above it,
    # the first candidate_scan_cap chunks holding it, read in id order, at most common_scan_rows read: the chunks its
    # posting list would have given first, without reading the whole list. (With the bound at candidate_scan_cap, a term
    # in 11,700 of a million chunks was met in 580 of them, none among the best ten.)
    common_probe_rows: int = 2_000
    common_scan_rows: int = 50_000
    common_index_df: int = 20_000
    # When every question term is common, its best BM25 matches are the chunks that repeat its rarest term most, which
    # the table order finds only by chance: at a million chunks, a question of two terms in 37% and 86% of chunks found
    # none of its exact top ten (recall@10 over 40 questions 0.9725; 0.9975 with the tiers). Migration 0010 indexes, for
    # each chunk, the lexemes it holds at least twice, by tier of term frequency; when the rarest term is in more than
    # common_index_df chunks, a search reads its tiers from the highest down until the asker may see n chunks in them,
    # and the table-order scan runs only if they fall short. (Walking every question term's tiers cost a reader of 10%
    # of the documents 30 ms more at p95, for the same recall.) Highest first; they must match `bm25_tf_tiers`.
    tf_tiers: tuple[int, ...] = (32, 23, 16, 11, 8, 6, 5, 4, 3, 2)
    # HNSW's search list (`hnsw.ef_search`) grows with the corpus. As the graph (pgvector's m 16, ef_construction 64)
    # grows, a search more often settles among the wrong neighbours and misses even a question's clear answer, whose
    # cosine to it is far above the rest's. Measured with `bench/search.py`'s clustered vectors (200 questions, each
    # planted near its answer; the dense statement alone, warm; README "Speed"):
    #   100k chunks: answer missed 4 times at ef 100, once at 200 and at 400; for a reader of 10% of the documents, the
    #                exact top hit found 195 / 199 / 199 times, recall@10 0.979 / 0.993 / 0.994.
    #   1M chunks:   missed 33 / 17 / 5 / 2 times at ef 100 / 200 / 400 / 800; the 10% reader's recall@10 0.71 / 0.80 /
    #                0.89 / 0.92, and that reader's statement was faster at 200-400 than at 100 (its iterative scan needs
    #                fewer rounds).
    #   1M chunks, the product's whole hybrid search, once the embedded server's buffer cache held the index (a quarter
    #                of RAM): ef 800 against 400 found 198 against 195 planted answers and declined 2 against 5, for
    #                1.9 ms more p50 (20.1 against 18.2) as everyone and 0.3 ms as a 10% reader.
    # So db.engine.HNSW_EF_SEARCH (200) up to 250,000 chunks, then a chunk count / chunks_per_ef_search, at most 800
    # (from a million chunks).
    chunks_per_ef_search: int = 1_250
    max_ef_search: int = 800
    # How long the corpus size that sets it is trusted before it is read again (one cheap read a minute).
    corpus_size_ttl_s: float = 60.0
    # A reader who may see at most this share of the chunks (CorpusLayout.visible_share, from Postgres' statistics;
    # 1 when unknown) has access checked inside the lexical index's scans (lexical_rows' `narrow`); a broader one
    # row by row. At a million chunks, for a reader of 10%, a common term's 17,704 postings fetched 17,068 rows to
    # keep 1,794 (40-80 ms); inside the scan only the reader's rows are fetched, but the principals' lists are read
    # too, which costs more than it saves as they grow. The lexical statement alone, both ways alternating, 100
    # questions, p50 / p95 ms per row -> in the index (docs/performance.md, "Lexical candidates"): 10% 14.7 / 44.1
    # -> 15.2 / 35.0, 20% 15.2 / 42.7 -> 17.3 / 48.8, 30% 20.8 / 52.0 -> 29.9 / 61.7, 50% 19.0 / 45.4 -> 35.5 / 84.3.
    # The statements return the same rows, so this only moves time. -1: never; 1.0: every reader (tests).
    narrow_reader_share: float = 0.15

    def params(self) -> dict[str, object]:
        """The knobs as the lexical statement's bind parameters."""
        return {
            "rare_corpus": self.rare_term_corpus_size,
            "candidate_postings": self.candidate_postings,
            "together_corpus": self.together_corpus_size,
            "together_postings": self.together_postings,
            "together_max_df": self.together_max_df,
            "together_triple_max_df": self.together_triple_max_df,
            "together_cap": self.together_cap,
            "scan_cap": self.candidate_scan_cap,
            "common_index_df": self.common_index_df,
            "common_probe_rows": self.common_probe_rows,
            "common_scan_rows": self.common_scan_rows,
            "tf_tiers": list(self.tf_tiers),
        }


# A search limited to some sources names their ids (resolved from the names before the statement, `_source_ids`)
# as a bind parameter compared with the partition key: Postgres then prunes every other source's partition (migration
# 0019) as it plans the statement for those values, and scans only theirs. It prunes with `= ANY(array)` only for an
# array it knows when planning, so such a statement is always planned for its values (never a generic plan), and a
# condition that also had to let every source through (`:sources IS NULL OR ...`), or ids from a subquery, would
# leave every partition in the plan: a search of every source runs a statement without the condition.
_SOURCE_FILTER = "    AND c.source_id = ANY(CAST(:source_ids AS integer[]))\n"
_FILTERS = """
        c.access && CAST(:principals AS text[])
{source_filter}    AND (CAST(:updated_after AS timestamptz) IS NULL OR c.doc_updated_at >= CAST(:updated_after AS timestamptz))
"""

# The same filters, with the access check kept out of index use: for a posting list bounded by
# CANDIDATE_POSTINGS, checking each row's access list is cheaper than building the bitmap of every chunk the asker
# may see from the access index (10,000 rows for a reader of 10% of 100k chunks, 100,000 for everyone), which is
# what the planner picks otherwise (it cannot estimate a posting list computed during the query).
_FILTERS_PER_ROW = _FILTERS.replace(
    "c.access && CAST(:principals AS text[])", "(c.access && CAST(:principals AS text[])) IS TRUE"
)

_CORPUS_SIZE = text("SELECT n_chunks FROM corpus_stats WHERE id = 1")



def _with_sources(sql: str, by_source: bool) -> str:
    """`sql` with its `{source_filter}`s as a search of some sources (by_source) or of every source has them."""
    return sql.replace("{source_filter}", _SOURCE_FILTER if by_source else "")


_PERMITTED_COUNT = {
    by_source: text(_with_sources("SELECT count(*) AS n FROM (SELECT 1 FROM chunks c WHERE " + _FILTERS
                                  + " LIMIT :n) permitted", by_source))
    for by_source in (False, True)
}

_LEXICAL_CTES = """
question_terms AS (
    -- The question's terms in the vocabulary, with their idf (from every chunk's statistics).
    SELECT l.id, l.df, l.lexeme, _q.literal, s.n, ln(1 + (s.n - l.df + 0.5) / (l.df + 0.5)) AS idf
    FROM lexemes l
    CROSS JOIN (SELECT greatest(n_chunks, 1)::float8 AS n FROM corpus_stats WHERE id = 1) s
    CROSS JOIN LATERAL (SELECT '''' || replace(replace(l.lexeme, '\\', '\\\\'), '''', '''''') || '''' AS literal) _q
    WHERE l.lexeme = ANY(tsvector_to_array(to_tsvector(CAST(:config AS regconfig), :query))) AND l.df > 0
),
rare_terms AS MATERIALIZED (
    -- The terms that may bring candidates (in a small corpus every term; else those with short posting lists),
    -- kept only when they occur in at least one chunk the asker may search. A term found only in chunks they may
    -- not see must change nothing they receive (scores, order, abstention, candidates), or the results would tell
    -- them the word exists in a document hidden from them. One GIN probe per term, cheap for short lists.
    -- (A term with a long posting list, which only a search with every term brings, is looked for as a common
    -- one is: see _COMMON_TERM_VISIBLE.)
    -- The match is written twice on purpose. The planner cannot see the term (it comes from this query), so it
    -- guesses that 0.5% of chunks hold it, and for EXISTS, which stops at the first row, a sequential scan then
    -- looks cheaper than the GIN index; a rare term is in far fewer chunks, and the scan read 8 ms of a million
    -- chunks per term. Two conditions make the guess 0.0025%, and the index is used (about 0.2 ms).
    SELECT t.* FROM question_terms t
    WHERE (t.n < :rare_corpus OR t.df <= :candidate_postings)
      AND CASE WHEN t.df <= :candidate_postings
               THEN EXISTS (SELECT 1 FROM chunks c
                            WHERE c.tsv @@ CAST(t.literal AS tsquery) AND c.tsv @@ CAST(t.literal AS tsquery)
                              AND {term_filters})
               ELSE {common_term_visible} END
),
candidate_terms AS (
    -- The rarest of those while their posting lists add up to CANDIDATE_POSTINGS (the rarest one always).
    SELECT r.literal FROM (
        SELECT r.*, row_number() OVER (ORDER BY r.df, r.id) AS nth, sum(r.df) OVER (ORDER BY r.df, r.id) AS postings
        FROM rare_terms r
    ) r
    WHERE r.n < :rare_corpus OR r.nth = 1 OR r.postings <= :candidate_postings
),
pairable AS (
    -- Whether two question terms make a pair by their own statistics (posting list lengths, expected chunks in
    -- common), whatever the other terms are.
    SELECT a.id AS a, b.id AS b, a.literal AS a_literal, b.literal AS b_literal,
           a.literal || ' & ' || b.literal AS pair,
           a.df::float8 * b.df / a.n AS expected,
           a.df <= :together_max_df AND b.df <= :together_max_df
           AND a.df::float8 * b.df / a.n <= :together_postings AS qualifies
    FROM question_terms a JOIN question_terms b ON a.id < b.id
    WHERE a.n >= :rare_corpus AND a.n >= :together_corpus
),
together_groups AS (
    -- In a large corpus, pairs of the question terms that bring no candidates above, and triples none of whose pairs
    -- qualifies: each group by its own terms, never by the other terms, so a term the asker cannot find changes no
    -- other group (its own groups bring only chunks the asker may not see).
    SELECT CAST(p.pair AS tsquery) AS terms, p.expected, p.a, p.b, 0 AS c
    FROM pairable p
    WHERE p.qualifies
      AND p.a_literal NOT IN (SELECT literal FROM candidate_terms)
      AND p.b_literal NOT IN (SELECT literal FROM candidate_terms)
    UNION ALL
    SELECT CAST(ab.pair || ' & ' || c.literal AS tsquery), ab.expected * c.df / c.n, ab.a, ab.b, c.id
    FROM pairable ab
    JOIN question_terms a ON a.id = ab.a JOIN question_terms b ON b.id = ab.b
    JOIN question_terms c ON c.id > ab.b
    JOIN pairable ac ON ac.a = ab.a AND ac.b = c.id
    JOIN pairable bc ON bc.a = ab.b AND bc.b = c.id
    WHERE NOT (ab.qualifies OR ac.qualifies OR bc.qualifies)
      AND greatest(a.df, b.df, c.df) <= :together_triple_max_df
      AND ab.expected * c.df / c.n <= :together_postings
),
together AS MATERIALIZED (
    -- The chunks holding every term of a group, group by group, the most selective first (GIN walks the shortest
    -- posting list of an AND and skips through the others; one OR of all the groups would read every list whole),
    -- the asker's access checked row by row before the cap (chunks they may not see take no place). A chunk this
    -- brings may come twice, or also from `scored`'s scans: `lexical` scores it once.
    SELECT c.id, c.source_id, c.bm25
    FROM (SELECT * FROM together_groups ORDER BY expected, a, b, c) g
    CROSS JOIN LATERAL (
        SELECT c.id, c.source_id, c.bm25 FROM chunks c WHERE c.tsv @@ g.terms AND {term_filters} LIMIT :together_cap
    ) c
    LIMIT :together_cap
),
common_term AS MATERIALIZED (
    -- When every term is common: the rarest one the asker can find, tried in order of document frequency; not
    -- needed when the groups above bring n candidates (its chunks are only the first ones found that hold one term).
    SELECT t.id, t.df, t.literal FROM (SELECT * FROM question_terms ORDER BY df, id OFFSET 0) t
    WHERE NOT EXISTS (SELECT 1 FROM rare_terms) AND (SELECT count(*) FROM together) < :n AND {common_term_visible}
    LIMIT 1
),
tier_walk AS (
    -- When the common term (above) is in more chunks than are read through the GIN index: the chunks that repeat it,
    -- from the index of term-frequency tiers (migration 0010), read tier by tier from the highest down until the
    -- asker may see n of them or the tiers run out. (Recursive: one row per tier read.)
    SELECT t.id, 0 AS nth, CAST(NULL AS text) AS token, 0::bigint AS found
    FROM common_term t
    WHERE t.df > :common_index_df
    UNION ALL
    SELECT w.id, w.nth + 1, x.token, w.found + (
        -- the match twice: see rare_terms (a tier's list is short, the planner cannot know it)
        SELECT count(*) FROM (SELECT 1 FROM chunks c
                              WHERE {tiers_of_c} @@ CAST(x.token AS tsquery)
                                AND {tiers_of_c} @@ CAST(x.token AS tsquery) AND {row_filters}
                              LIMIT :n) v)
    FROM tier_walk w
    JOIN question_terms t ON t.id = w.id
    CROSS JOIN LATERAL (
        SELECT '''' || replace(replace(t.lexeme || '#' || (CAST(:tf_tiers AS int[]))[w.nth + 1], '\\', '\\\\'),
                               '''', '''''') || '''' AS token
    ) x
    WHERE w.nth < cardinality(CAST(:tf_tiers AS int[])) AND w.found < :n
),
bm25_query AS (
    SELECT
        -- idf weights of the question's terms as a sparse vector: <#> with a chunk's weights is its BM25 score
        -- (a term that no permitted chunk contains adds nothing to any score the asker sees)
        ('{' || coalesce((SELECT string_agg(t.id || ':' || t.idf, ',' ORDER BY t.id) FROM question_terms t), '')
             || '}/{sparse_dim}')::sparsevec AS weights,
        -- what brings candidates through the GIN index: rare terms, or a common term in at most COMMON_INDEX_DF
        -- chunks (all of them: see the LIMIT in `scored`)
        coalesce((SELECT string_agg(literal, ' | ') FROM candidate_terms),
                 (SELECT literal FROM common_term WHERE df <= :common_index_df))::tsquery AS candidates,
        -- the chunks repeating that term most (tier_walk)
        (SELECT string_agg(token, ' | ') FROM tier_walk WHERE nth > 0)::tsquery AS repeated,
        -- when its tiers do not hold n chunks the asker may see: candidates also come from reading chunks in table
        -- order (below)
        (SELECT {holds_t} FROM common_term t
         WHERE t.df > :common_index_df
           AND NOT EXISTS (SELECT 1 FROM tier_walk w WHERE w.id = t.id AND w.found >= :n)) AS common
),
scored AS MATERIALIZED (
    SELECT c.id, c.source_id, -(c.bm25 <#> q.weights) AS score, c.bm25
    FROM (
        (SELECT c.id, c.source_id, c.bm25 FROM chunks c, bm25_query q
         WHERE c.tsv @@ q.candidates AND {candidate_filters}
         LIMIT greatest(:scan_cap, :common_index_df))
        UNION ALL
        (SELECT id, source_id, bm25 FROM together)
        UNION ALL
        (SELECT c.id, c.source_id, c.bm25 FROM chunks c, bm25_query q
         WHERE {tiers_of_c} @@ q.repeated AND {row_filters}
         LIMIT :scan_cap)
        UNION ALL
        -- A term in many chunks: its GIN posting list alone takes longer to read than the chunks of the table in
        -- id order until CANDIDATE_SCAN_CAP of them hold it (a BM25 weight is > 0 for every term a chunk
        -- holds, so the one-hot product says whether the chunk contains it; the weights are stored in the row).
        -- (The first condition does not depend on the row: evaluated once, it skips the scan for other questions.)
        (SELECT c.id, c.source_id, c.bm25
         FROM (SELECT id, bm25, access, source_id, doc_updated_at FROM chunks c WHERE true
{source_filter}               ORDER BY id LIMIT :common_scan_rows) c
         WHERE (SELECT common FROM bm25_query) IS NOT NULL
           AND (c.bm25 <#> (SELECT common FROM bm25_query)) < 0 AND {row_filters}
         LIMIT :scan_cap)
    ) c, bm25_query q
),
full_match AS (
    -- The score of an average-length chunk containing once every question term the asker can find (the sum of
    -- their idfs): rare terms were checked above; a common one is proven findable by a scored candidate that
    -- contains it, and only otherwise looked for (see common_term_visible).
    SELECT coalesce(sum(t.idf), 0) AS score
    FROM question_terms t
    WHERE t.id IN (SELECT id FROM rare_terms)
       OR CASE WHEN EXISTS (SELECT 1 FROM scored c
                            WHERE (c.bm25 <#> {holds_t}) < 0)
               THEN true
               ELSE {common_term_visible}
          END
),
lexical AS MATERIALIZED (
    SELECT s.id, s.source_id, max(s.score) AS score, max(f.score) AS full_match_score
    FROM scored s, full_match f
    GROUP BY s.id, s.source_id
    ORDER BY max(s.score) DESC, s.id
    LIMIT :n
)"""

# Whether the asker can find common term `t` (more postings than CANDIDATE_POSTINGS): first among the first
# COMMON_PROBE_ROWS chunks of the table (the weights in the row tell, no index: a term in a fair share of chunks is
# met within a few dozen rows), else in the GIN index. The index alone builds a bitmap of the whole posting list
# before it can answer: 80 ms for a term in 40% of a million chunks.
_COMMON_TERM_VISIBLE = """(
    EXISTS (SELECT 1 FROM (SELECT bm25, access, source_id, doc_updated_at FROM chunks c WHERE true
{source_filter}                           ORDER BY id LIMIT :common_probe_rows) c
            WHERE (c.bm25 <#> {holds_t}) < 0 AND {row_filters})
    OR EXISTS (SELECT 1 FROM chunks c WHERE c.tsv @@ CAST(t.literal AS tsquery) AND {filters}))"""


# Term `t` alone as a sparse vector (weight 1): its inner product `<#>` with a chunk's BM25 weights is < 0 exactly
# when the chunk holds t, since a weight is > 0 for every term a chunk holds.
_HOLDS_T = "('{' || t.id || ':' || '1}/{sparse_dim}')::sparsevec"


# Chunk c's term-frequency tiers, written as the index `chunks_tf_tiers` is (migration 0010), so that it is used.
_TIERS_OF_C = "coalesce(c.tf_tiers, bm25_tf_tiers(c.tsv))"


def _lexical_search_ctes(candidate_filters: str = _FILTERS_PER_ROW, term_filters: str = _FILTERS_PER_ROW) -> str:
    """The lexical statement's CTEs. `candidate_filters` is the asker's filter in the scan of the candidate terms'
    postings, `term_filters` in the rare terms' visibility probes and the groups' intersections: the scans of the
    lexical index (`chunks_tsv_access`). Open (_FILTERS) for a narrow reader, per row otherwise (see `narrow` in
    lexical_rows)."""
    return (_LEXICAL_CTES.replace("{common_term_visible}", _COMMON_TERM_VISIBLE).replace("{tiers_of_c}", _TIERS_OF_C)
            .replace("{candidate_filters}", candidate_filters).replace("{term_filters}", term_filters)
            .replace("{filters}", _FILTERS).replace("{row_filters}", _FILTERS_PER_ROW)
            .replace("{holds_t}", _HOLDS_T).replace("{sparse_dim}", str(BM25_SPARSE_DIM)))


# What a hit shows, read with each candidate: its text and its document (`c` is the chunk).
_SHOWN_COLUMNS = """c.document_id, c.text, c.heading, c.ordinal, d.external_id, d.title, d.url, d.path,
       s.name AS source"""
_SHOWN_JOINS = """JOIN documents d ON d.id = c.document_id
JOIN sources s ON s.id = d.source_id"""

# BM25's candidates, best first, with the full-match score (see full_match).
_LEXICAL_SELECT = f"""
SELECT l.id, l.score, l.full_match_score, {_SHOWN_COLUMNS}
FROM lexical l
JOIN chunks c ON c.id = l.id AND c.source_id = l.source_id
{{source_filter}}{_SHOWN_JOINS}"""
# The statement in each of its forms, built once: SQLAlchemy finds a statement's parameters with a regular expression
# over its text, which for BM25's 15,000 characters is a measurable share of a search's Python time.
# Keyed by (among_permitted, narrow, by_source). `among_permitted`: the asker's filters open to the indexes in the
# candidates' scan, for a search with every term (rare_corpus = EVERY_TERM): candidates are then only chunks the
# asker may see, however few of a term's postings those are. `narrow`: see lexical_rows.
_LEXICAL = {
    (among_permitted, narrow, by_source): text(_with_sources(
        "WITH RECURSIVE "
        + _lexical_search_ctes(_FILTERS if among_permitted or narrow else _FILTERS_PER_ROW,
                               _FILTERS if narrow else _FILTERS_PER_ROW)
        + _LEXICAL_SELECT, by_source))
    for among_permitted in (False, True) for narrow in (False, True) for by_source in (False, True)
}


def dense_sql(dimension: int, *, exact: bool = False, by_source: bool = False) -> str:
    """The HNSW search for the n chunks nearest the question that the asker may see. `dimension` is an int from the
    model, never user input. `exact` orders by the full-precision distance, which no index serves: an exact scan
    of the permitted chunks, for when the index scan falls short (fast for the small permitted sets where it does).
    `by_source`: the search is limited to the sources in :source_ids (only their partitions are scanned)."""
    dim = str(int(dimension))
    # the order from the half-precision HNSW index (store.vector_index_sql), the score at full precision
    order = f"c.embedding::halfvec({dim}) <=> CAST(:embedding AS halfvec({dim}))"
    if exact:
        order = f"c.embedding::vector({dim}) <=> CAST(:embedding AS vector({dim}))"
    return _with_sources(f"""
WITH dense AS MATERIALIZED (
    SELECT c.id, c.source_id, 1 - (c.embedding::vector({dim}) <=> CAST(:embedding AS vector({dim}))) AS score
    FROM chunks c
    WHERE {_FILTERS}
    ORDER BY {order}
    LIMIT :n
)
SELECT n.id, n.score, {_SHOWN_COLUMNS}
FROM dense n
JOIN chunks c ON c.id = n.id AND c.source_id = n.source_id
{{source_filter}}{_SHOWN_JOINS}""", by_source)


@cache
def _dense_statement(dimension: int, *, exact: bool = False, by_source: bool = False) -> TextClause:
    return text(dense_sql(dimension, exact=exact, by_source=by_source))


_SOURCE_IDS = text("SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids FROM sources WHERE name = ANY(:names)")


async def _source_ids(conn: AsyncConnection, params: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The statement's parameters with the ids of the sources it is limited to (`source_ids`, see _SOURCE_FILTER),
    and whether it is limited: one small read, only for a search of some sources."""
    names = params.get("sources")
    if names is None:
        return dict(params), False
    (row,) = await read_rows(conn, _SOURCE_IDS, {"names": list(names)})
    return {**params, "source_ids": list(row.ids)}, True


async def lexical_rows(conn: AsyncConnection, params: Mapping[str, Any], *, among_permitted: bool = False,
                       narrow: bool = False) -> list[Any]:
    """BM25's candidates, best first, each with what its hit shows and the full-match score. The question is
    tokenised as the chunks were (`lexical_text`: Chinese and Japanese split into words and bigrams).

    `among_permitted`: the statement with the asker's filters open to the indexes in the candidates' scan (see
    _LEXICAL). `narrow`: the asker may see a small share of the chunks (CorpusLayout.
    visible_share), so every scan of the lexical index checks access inside the index (migration 0023: GIN over
    tsv and access), and only the asker's own rows are fetched; for a reader of most chunks the principals' lists
    are nearly the whole table, and checking each fetched row is cheaper. Either statement returns the same rows."""
    params, by_source = await _source_ids(conn, {**params, "query": lexical_text(str(params["query"]))})
    statement = _LEXICAL[among_permitted, narrow, by_source]
    if among_permitted:
        return await read_rows(conn, statement, params)
    # Its plan cannot use the question (its terms are found while it runs) and barely the asker: the same rows
    # either way, and 2-2.7 ms less a search than planning it at every run. Not for a search of some sources: only a
    # plan made for their ids leaves the other sources' partitions out (see _SOURCE_FILTER).
    return await read_rows(conn, statement, params, generic_plan=not by_source)


async def dense_rows(conn: AsyncConnection, dimension: int, params: Mapping[str, Any], *, exact: bool = False,
                     settings: Mapping[str, str] | None = None) -> list[Any]:
    """The n chunks nearest the question that the asker may see (`settings`: e.g. hnsw.ef_search)."""
    params, by_source = await _source_ids(conn, params)
    return await read_rows(conn, _dense_statement(dimension, exact=exact, by_source=by_source), params,
                           settings=settings)


async def corpus_size(conn: AsyncConnection) -> int:
    """The number of chunks (corpus_stats), 0 before the first ingest."""
    rows = await read_rows(conn, _CORPUS_SIZE, {})
    return rows[0].n_chunks if rows else 0


# Each partition of `chunks` (migration 0019: `chunks_p<source id>`, and `chunks_default` for strays) with Postgres'
# own estimate of its rows: the larger of the planner's (reltuples, set by VACUUM and ANALYZE, kept across restarts)
# and the statistics collector's live count (n_live_tup, which follows every write between ANALYZEs but is reset
# after a crash). Catalog reads only: no partition is scanned. No rows for a table that is not partitioned.
_PARTITION_ROWS = text("""
SELECT s.name AS source, greatest(c.reltuples, st.n_live_tup, 0)::bigint AS estimated_rows
FROM pg_inherits h
JOIN pg_class c ON c.oid = h.inhrelid
LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
LEFT JOIN sources s ON c.relname = 'chunks_p' || s.id
WHERE h.inhparent = 'chunks'::regclass
""")


# Postgres' statistics of `access` in each table holding chunks (`chunks`, or each of its partitions): its rows,
# and ANALYZE's most common elements (principals) with the share of rows holding each; the frequencies end with the
# lowest of them (every unlisted principal is rarer). No statistics row for a table never analysed. Catalog reads
# only.
_ACCESS_STATISTICS = text("""
SELECT greatest(c.reltuples, 0)::float8 AS estimated_rows, s.attname IS NOT NULL AS analysed,
       s.most_common_elems::text::text[] AS principals, s.most_common_elem_freqs AS shares
FROM pg_class c
LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = c.relname AND s.attname = 'access'
                     AND NOT s.inherited
WHERE c.relkind = 'r'
  AND (c.oid = to_regclass('chunks')
       OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass('chunks')))
""")


@dataclass(frozen=True)
class AccessStatistics:
    """One table's statistics of `access` (_ACCESS_STATISTICS): `shares` None when it was never analysed."""

    rows: float
    shares: Mapping[str, float] | None
    unlisted: float  # the share taken for a principal not listed (Postgres' own estimate for one)

    def visible_share(self, principals: Sequence[str]) -> float:
        """At most what share of this table's rows a reader of `principals` may see (the sum of theirs, so a chunk
        open to two of them counts twice): 1 when unknown."""
        if self.shares is None:
            return 1.0
        return min(1.0, sum(self.shares.get(p, self.unlisted) for p in principals))


@dataclass(frozen=True)
class CorpusLayout:
    """How many chunks the index holds, and how they are spread over the partitions of `chunks` (by source name;
    None for the default partition): the size of the HNSW graphs a search walks. `partitions` is empty when `chunks`
    is one table (one graph of every chunk). `access`: each table's statistics of who may see its chunks."""

    chunks: int
    partitions: Mapping[str | None, int]
    access: Sequence[AccessStatistics] = ()

    def visible_share(self, principals: Sequence[str]) -> float:
        """Roughly what share of the chunks a reader of `principals` may see, from Postgres' statistics (an upper
        estimate; 1 where a table was never analysed). Decides only how a search checks access (lexical_rows'
        `narrow`), never what it returns."""
        rows = sum(t.rows for t in self.access)
        if rows <= 0:
            return 1.0
        return sum(t.rows * t.visible_share(principals) for t in self.access) / rows

    def largest_graph(self, sources: Sequence[str] | None = None) -> int:
        """The chunks in the largest HNSW graph a search of `sources` (None: every source) walks. One table: the
        corpus. Partitioned: each searched partition's share of the corpus by Postgres' estimates (which may lag
        behind the latest writes), times the exact corpus size, so that one partition holding everything counts
        exactly the corpus. Without an estimate yet (a partition never analysed), the corpus: the longer search
        list is the safe side."""
        if not self.partitions:
            return self.chunks
        total = sum(self.partitions.values())
        wanted = set(sources) if sources is not None else None
        # the default partition holds a source's chunks only when it has no partition of its own: searched always
        searched = [rows for source, rows in self.partitions.items()
                    if wanted is None or source is None or source in wanted]
        if total <= 0 or not searched:
            return self.chunks
        return self.chunks * max(searched) // total


async def corpus_layout(conn: AsyncConnection) -> CorpusLayout:
    """The corpus size, its spread over partitions and the statistics of its access lists (CorpusLayout): three
    small catalog reads."""
    partitions = {r.source: int(r.estimated_rows) for r in await read_rows(conn, _PARTITION_ROWS, {})}
    access = []
    for r in await read_rows(conn, _ACCESS_STATISTICS, {}):
        listed = list(r.principals or [])
        shares = [float(x) for x in (r.shares or [])]
        access.append(AccessStatistics(
            float(r.estimated_rows),
            dict(zip(listed, shares, strict=False)) if r.analysed else None,
            # as Postgres' own estimate for an unlisted element: half the lowest listed share, at most 0.5%
            min(shares[len(listed)] / 2, 0.005) if len(shares) > len(listed) else 0.005))
    return CorpusLayout(await corpus_size(conn), partitions, tuple(access))


async def permitted_count(conn: AsyncConnection, params: Mapping[str, Any]) -> int:
    """How many chunks the asker may see, counted up to params["n"]."""
    params, by_source = await _source_ids(conn, params)
    (permitted,) = await read_rows(conn, _PERMITTED_COUNT[by_source], params)
    return int(permitted.n)


@cache
def index_markers() -> tuple[tuple[str, str], ...]:
    """INDEX_MARKERS as the index tokenises them (`lexical_text`). Computed once: the Chinese markers are segmented
    by jieba, whose first use loads its dictionary (one to three seconds of CPU), which must not happen on the event
    loop (`indexed_languages` calls this in a thread; `ragbot run` calls it at start through
    `KnowledgeBase.prepare_language_check`)."""
    return tuple((language, lexical_text(words)) for language, words in INDEX_MARKERS.items())


async def indexed_languages(conn: AsyncConnection, config: str) -> set[str]:
    """The languages the index holds documents in, read from its vocabulary (knowledge.storage.words.INDEX_MARKERS:
    two marker words of a language, or, for Japanese, Korean and Russian, any word in their script). One statement.
    The markers are segmented in a thread: a bot's first question stalled its event loop for seconds while jieba
    loaded, long enough for the heartbeats of the answers in flight to miss their leases."""
    markers = list(await asyncio.to_thread(index_markers))
    parts = [f"SELECT CAST(:l{i} AS text) AS language WHERE (SELECT count(*) FROM lexemes WHERE df > 0 AND lexeme = "
             f"ANY(tsvector_to_array(to_tsvector(CAST(:config AS regconfig), :w{i})))) >= 2"
             for i in range(len(markers))]
    scripts = list(INDEX_SCRIPTS.items())
    parts += [f"SELECT CAST(:s{i} AS text) WHERE EXISTS (SELECT 1 FROM lexemes WHERE df > 0 AND lexeme ~ :p{i})"
              for i in range(len(scripts))]
    params: dict[str, object] = {"config": config}
    for i, (language, words) in enumerate(markers):
        params[f"l{i}"], params[f"w{i}"] = language, words
    for i, (language, pattern) in enumerate(scripts):
        params[f"s{i}"], params[f"p{i}"] = language, pattern
    rows = await conn.execute(text(" UNION ALL ".join(parts)), params)
    return {str(r[0]) for r in rows}
