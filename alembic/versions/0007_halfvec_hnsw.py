"""The HNSW index holds half-precision vectors; the column keeps full precision for the scores.

Before: `chunks_embedding_hnsw_<dim>` on `embedding::vector(dim)`. After: `chunks_embedding_hnsw_half_<dim>` on
`embedding::halfvec(dim)` (see `knowledge.storage.documents.vector_index_sql` for the measurements). Searches order by the
halfvec expression, so a database upgraded without this index would scan every chunk: the upgrade builds it (a
few seconds per 10,000 chunks) and drops the old one. A database that has never been indexed has neither; its
first sync creates the index.

Revision ID: 0007
Revises: 0006
"""

from sqlalchemy import text

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _dimension() -> int | None:
    row = op.get_bind().execute(text("SELECT value FROM kb_meta WHERE key = 'embedding_dimension'")).first()
    return int(row[0]) if row is not None else None


def upgrade() -> None:
    dimension = _dimension()
    if dimension is None:
        return
    op.execute("SET LOCAL maintenance_work_mem = '512MB'")
    op.execute(
        f"CREATE INDEX IF NOT EXISTS chunks_embedding_hnsw_half_{dimension} ON chunks "
        f"USING hnsw ((embedding::halfvec({dimension})) halfvec_cosine_ops)"
    )
    op.execute(f"DROP INDEX IF EXISTS chunks_embedding_hnsw_{dimension}")


def downgrade() -> None:
    dimension = _dimension()
    if dimension is None:
        return
    op.execute(
        f"CREATE INDEX IF NOT EXISTS chunks_embedding_hnsw_{dimension} ON chunks "
        f"USING hnsw ((embedding::vector({dimension})) vector_cosine_ops)"
    )
    op.execute(f"DROP INDEX IF EXISTS chunks_embedding_hnsw_half_{dimension}")
