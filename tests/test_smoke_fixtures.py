async def test_fresh_kb_starts_empty(fresh_kb):
    status = await fresh_kb.status()
    assert status.documents == 0 and status.chunks == 0
    assert status.embedding_model is None  # opening loads no model; the first search or ingest records it
    await fresh_kb.ensure_embedding_space()
    status = await fresh_kb.status()
    assert status.embedding_model == "all-MiniLM-L6-v2" and status.embedding_dimension == 384
