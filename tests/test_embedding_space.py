"""Changing EMBEDDING_MODEL re-embeds every chunk with the new model instead of mixing two models' vectors."""

from conftest import write
from sqlalchemy import text

from knowledge.embedding.encoder import resolve_model_path
from knowledge.search.retrieval import SearchFilters
from knowledge.sources.folder import FolderSource


async def test_switching_models_re_embeds_and_search_keeps_working(kb_factory, fresh_database, tmp_path):
    url = fresh_database()
    write(tmp_path / "docs", "vpn.md", "# VPN\n\nInstall Tailscale and sign in with Okta.")
    write(tmp_path / "docs", "pto.md", "# PTO\n\nYou get 25 days of paid time off.")
    first = await kb_factory(url)
    await first.sync(FolderSource(tmp_path / "docs"))
    await first.close()

    # The same weights under another name (a local path) count as another model: everything is re-embedded.
    other_name = resolve_model_path("all-MiniLM-L6-v2")
    second = await kb_factory(url, embedding_model=other_name)
    # Opening loads no model and re-embeds nothing yet (status must stay instant); the first search does it.
    assert (await second.status()).embedding_model == "all-MiniLM-L6-v2"
    hits = (await second.search("how do I connect to the VPN", SearchFilters(), k=1, mode="dense")).hits
    assert hits[0].external_id == "vpn.md"
    status = await second.status()
    assert status.embedding_model == other_name
    async with second.engine.connect() as conn:
        models = (await conn.execute(text("SELECT model, count(*) FROM embedding_cache GROUP BY model ORDER BY model"))).all()
        missing = (await conn.execute(text("SELECT count(*) FROM chunks WHERE embedding IS NULL"))).scalar_one()
        indexes = (await conn.execute(text("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'chunks_embedding_hnsw_%'"))).scalars().all()
    assert {m for m, _ in models} == {"all-MiniLM-L6-v2", other_name}
    assert missing == 0
    assert indexes == ["chunks_embedding_hnsw_half_384"]
    hits = (await second.search("how do I connect to the VPN", SearchFilters(), k=1, mode="dense")).hits
    assert hits[0].external_id == "vpn.md"
