"""How the dense and BM25 candidate lists become one ranking (knowledge.search.fusion): what a user sees in the order of
the sources an answer cites."""

from knowledge.search.fusion import Candidate, Fusion, LexicalCandidates


def fusion(method: str = "adaptive", per_document: int = 2, limit: int = 10) -> Fusion:
    return Fusion(method, dense_weight=0.5, rrf_k=60, per_document=per_document, limit=limit)


def test_a_chunk_both_retrievers_found_outranks_chunks_only_one_found() -> None:
    dense = [Candidate(1, 10, 0.9), Candidate(2, 20, 0.8), Candidate(3, 30, 0.1)]
    lexical = LexicalCandidates([Candidate(4, 40, 12.0), Candidate(2, 20, 11.0), Candidate(5, 50, 1.0)], 12.0)
    for method in ("adaptive", "convex", "rrf"):
        ranked = fusion(method).fuse(dense, lexical)
        assert ranked[0].id == 2, method
        assert (ranked[0].dense_score, ranked[0].lexical_score) == (0.8, 11.0)
        assert {f.id for f in ranked} == {1, 2, 3, 4, 5}


def test_weak_lexical_matches_count_less_than_full_ones() -> None:
    """Adaptive fusion: when the best BM25 match holds only a fraction of what a chunk holding every question term
    would score, the BM25 side's say shrinks by that fraction, so the dense side's best chunk stays on top."""
    dense = [Candidate(1, 10, 0.9), Candidate(2, 20, 0.6), Candidate(4, 40, 0.5)]
    lexical = LexicalCandidates([Candidate(3, 30, 2.0), Candidate(4, 40, 1.0)], full_match_score=20.0)
    assert [f.id for f in fusion("adaptive").fuse(dense, lexical)] == [1, 2, 3, 4]
    # convex ignores the confidence: the lexical leader draws level with the dense leader
    assert [f.id for f in fusion("convex").fuse(dense, lexical)] == [1, 3, 2, 4]
    nothing_findable = LexicalCandidates([Candidate(3, 30, 2.0)], full_match_score=0.0)
    scores = {f.id: f.score for f in fusion("adaptive").fuse(dense, nothing_findable)}
    assert scores[3] == 0.0


def test_one_document_fills_at_most_per_document_places() -> None:
    dense = [Candidate(i, 7, 1.0 - i / 100) for i in range(1, 6)] + [Candidate(9, 8, 0.5)]
    ranked = fusion(per_document=2).fuse(dense, None)
    assert [f.id for f in ranked] == [1, 2, 9]
    assert [f.score for f in ranked] == [0.99, 0.98, 0.5]  # a dense-only search ranks by cosine similarity


def test_ties_are_broken_by_chunk_id_and_limit_is_kept() -> None:
    lexical = LexicalCandidates([Candidate(i, i, 3.0) for i in (5, 3, 4, 1, 2)], 3.0)
    ranked = fusion(limit=3).fuse(None, lexical)
    assert [f.id for f in ranked] == [1, 2, 3]
    assert all(f.dense_score is None for f in ranked)
