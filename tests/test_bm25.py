"""BM25 inside Postgres: the scores are exact Okapi BM25 and the corpus statistics stay right through changes."""

import math
from collections import Counter

from conftest import write
from sqlalchemy import text

from knowledge.search.retrieval import SearchFilters
from knowledge.sources.folder import FolderSource

DOCS = {
    "cats.md": "# Cats\n\nCats sleep most of the day. A cat purrs when content; cats chase mice.",
    "dogs.md": "# Dogs\n\nDogs need walks twice a day. A dog barks at the mail carrier.",
    "pets.md": "# Pets at the office\n\nPets are welcome on Fridays if they are calm: cats in carriers, dogs on leads.",
    "fish.md": "# Aquarium\n\nThe lobby aquarium holds tropical fish. Feed the fish once a day, never more.",
    "birds.md": "# Birds\n\nParrots can live for decades and learn dozens of words.",
}


async def reference_scores(kb, query: str) -> dict[str, float]:
    """BM25 recomputed in Python from the chunks' own lexemes (Postgres only tokenises)."""
    async with kb.engine.connect() as conn:
        stats = (await conn.execute(text("SELECT k1, b, weights_avgdl FROM corpus_stats"))).one()
        rows = (
            await conn.execute(
                text(
                    "SELECT d.external_id, c.lexical_len, t.lexeme, coalesce(array_length(t.positions, 1), 1) AS tf "
                    "FROM chunks c JOIN documents d ON d.id = c.document_id, unnest(c.tsv) t"
                )
            )
        ).all()
        terms = (
            await conn.execute(text("SELECT tsvector_to_array(to_tsvector('english', :q))"), {"q": query})
        ).scalar_one()
    docs: dict[str, dict[str, int]] = {}
    lengths: dict[str, int] = {}
    for external_id, length, lexeme, tf in rows:
        docs.setdefault(external_id, {})[lexeme] = tf
        lengths[external_id] = length
    n = len(docs)
    df = Counter(lexeme for lexemes in docs.values() for lexeme in lexemes)
    scores = {}
    for external_id, tfs in docs.items():
        score = 0.0
        for term in terms:
            if term in tfs:
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                tf = tfs[term]
                norm = 1 - stats.b + stats.b * lengths[external_id] / stats.weights_avgdl
                score += idf * tf * (stats.k1 + 1) / (tf + stats.k1 * norm)
        if score > 0:
            scores[external_id] = score
    return scores


async def assert_statistics_match_chunks(kb) -> None:
    async with kb.engine.connect() as conn:
        stats = (await conn.execute(text("SELECT n_chunks, total_len, weights_avgdl FROM corpus_stats"))).one()
        actual = (await conn.execute(text("SELECT count(*), coalesce(sum(lexical_len), 0) FROM chunks"))).one()
        assert (stats.n_chunks, stats.total_len) == tuple(actual)
        wrong_df = (
            await conn.execute(
                text(
                    """
                    SELECT l.lexeme, l.df, coalesce(x.n, 0) AS actual
                    FROM lexemes l
                    LEFT JOIN (SELECT t.lexeme, count(*) AS n FROM chunks c, unnest(c.tsv) t GROUP BY t.lexeme) x
                           ON x.lexeme = l.lexeme
                    WHERE l.df <> coalesce(x.n, 0)
                    """
                )
            )
        ).all()
        assert wrong_df == []
        if stats.n_chunks:
            avgdl = stats.total_len / stats.n_chunks
            assert abs(stats.weights_avgdl - avgdl) / avgdl <= 0.10  # stored weights never drift further


async def lexical(kb, query: str) -> dict[str, float]:
    hits = (await kb.search(query, SearchFilters(), k=10, mode="lexical", max_per_document=1)).hits
    return {h.external_id: h.score for h in hits}


async def test_scores_are_exact_bm25_and_stats_follow_adds_edits_and_deletes(fresh_kb, tmp_path):
    root = tmp_path / "pets"
    for name, body in DOCS.items():
        write(root, name, body)
    await fresh_kb.sync(FolderSource(root))
    await assert_statistics_match_chunks(fresh_kb)
    for query in ("cats and dogs", "how often should I feed the fish?", "parrot words"):
        expected = await reference_scores(fresh_kb, query)
        got = await lexical(fresh_kb, query)
        assert got.keys() == expected.keys()
        for external_id, score in expected.items():
            assert math.isclose(got[external_id], score, rel_tol=1e-4), (query, external_id)

    (root / "dogs.md").unlink()
    (root / "birds.md").unlink()
    write(root, "cats.md", DOCS["cats.md"] + " Cats also enjoy boxes, and a cat will nap in any box it finds.")
    await fresh_kb.sync(FolderSource(root))
    await assert_statistics_match_chunks(fresh_kb)
    expected = await reference_scores(fresh_kb, "cats and dogs")
    got = await lexical(fresh_kb, "cats and dogs")
    assert got.keys() == expected.keys() == {"cats.md", "pets.md"}
    for external_id, score in expected.items():
        assert math.isclose(got[external_id], score, rel_tol=1e-4)


async def test_questions_use_or_semantics(fresh_kb, tmp_path):
    root = tmp_path / "pets"
    for name, body in DOCS.items():
        write(root, name, body)
    await fresh_kb.sync(FolderSource(root))
    # No document contains every term; an AND query would find nothing.
    got = await lexical(fresh_kb, "what is the policy for bringing a parrot or goldfish to the aquarium")
    assert set(got) == {"birds.md", "fish.md"}


async def test_rare_terms_outweigh_common_ones(fresh_kb, tmp_path):
    root = tmp_path / "pets"
    for name, body in DOCS.items():
        write(root, name, body)
    await fresh_kb.sync(FolderSource(root))
    got = await lexical(fresh_kb, "day mail carrier")  # "day" is in three documents, "mail carrier" in one
    assert next(iter(got)) == "dogs.md"


async def test_emptying_the_index_resets_statistics(fresh_kb, tmp_path):
    root = tmp_path / "pets"
    for name, body in DOCS.items():
        write(root, name, body)
    await fresh_kb.sync(FolderSource(root))
    assert await fresh_kb.remove_source("pets") == len(DOCS)
    await assert_statistics_match_chunks(fresh_kb)
    async with fresh_kb.engine.connect() as conn:
        assert (await conn.execute(text("SELECT n_chunks, total_len FROM corpus_stats"))).one() == (0, 0)
    assert await lexical(fresh_kb, "cats") == {}
