"""`chunks` partitioned by source (issue 43, item 4): each source's HNSW graph and lexical indexes stay small, and a
search limited to some sources (a channel's sources, `--source`) prunes the other partitions.

Layout: `chunks` is LIST-partitioned on `source_id`, one partition `chunks_p<source id>` per source (created by a
trigger on `sources` when a source is added, `chunks_create_partition`) plus `chunks_default` for any chunk whose
source has none. The indexes are declared on the parent, so every partition gets its own HNSW graph, GIN indexes and
primary key. The BM25 statistics stay global: the statement triggers on the parent count every partition's chunks
in the one `corpus_stats` row and the one `lexemes` table.

What partitioning forces:
- The primary key includes the partition key: (id, source_id). Chunk ids stay unique across partitions because every
  partition takes them from the one sequence `chunks_id_seq` (nothing else writes ids).
- Nothing references chunks by foreign key (citations and conversation turns keep chunk ids in arrays,
  `cited_chunk_ids`, `context_chunk_ids`, `usage`'s chunk lists, and read them with joins that tolerate a deleted
  chunk), so no referencing key changes. `chunks.document_id` still references `documents` (ON DELETE CASCADE): a
  partitioned table may reference a plain one.

The move, without downtime for reads: the partitioned table is built beside the old one (`chunks_partitioned`), the
old table is locked against writes only (SHARE: searches go on, a sync's writes wait), the rows are copied in batches
of _BATCH in id order (no statistics trigger fires on the copy: the statistics already count these chunks), the old
table's indexes and triggers are recreated on the new one from their definitions, and only then are the names swapped
(ACCESS EXCLUSIVE on the old table for the renames and its drop). Searches answer from the old table until the swap.
Alembic runs an upgrade in one transaction (db.migrate holds the migrations lock in it), so the swap's lock lasts
until that transaction commits: run this migration last in its upgrade (it is the head) so the commit follows the
swap. The downgrade moves the chunks back into one table the same way.

Revision ID: 0019_chunk_partitions
Revises: 0018_cjk_lexemes
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from alembic import op

revision = "0019_chunk_partitions"
down_revision = "0018_cjk_lexemes"
branch_labels = None
depends_on = None

_BATCH = 20_000

# A source's partition: created on its own and attached (ATTACH takes SHARE UPDATE EXCLUSIVE on `chunks`, so
# searches and other sources' writes go on; CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE). It checks
# that the default partition holds none of the source's rows, holding that (normally empty) partition until the
# transaction that added the source commits: those are short (store.ensure_source, sources.save_source). The new
# table gets every index and row trigger of the parent as it is attached. Does nothing when `chunks` is not
# partitioned (a database downgraded past this migration keeps the function until the downgrade drops it).
_CREATE_PARTITION = r"""
CREATE OR REPLACE FUNCTION chunks_create_partition(parent regclass, source integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    name text := 'chunks_p' || source;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = parent) <> 'p' OR to_regclass(name) IS NOT NULL THEN
        RETURN;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)',
                   name, parent);
    EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I FOR VALUES IN (%s)', parent, name, source);
END $$;

CREATE OR REPLACE FUNCTION chunks_partition_for_source() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM chunks_create_partition('chunks'::regclass, NEW.id);
    RETURN NULL;
END $$;
"""


def _dimension_rows(bind: Connection) -> int:
    return int(bind.execute(text("SELECT count(*) FROM chunks")).scalar_one())


def _index_build_memory(chunks: int) -> str:
    # as knowledge.storage.documents.index_build_memory (a migration does not import the storage module)
    wanted_mb = chunks * 1536 // 2**20
    return f"{min(max(512, wanted_mb), 2048)}MB"


def _rebuild(bind: Connection, *, partitioned: bool) -> None:
    """Build the other layout of `chunks` beside it, copy the rows in batches, recreate its indexes and triggers,
    then swap the names and drop the old table (see the module docstring)."""
    new = "chunks_partitioned" if partitioned else "chunks_unpartitioned"
    retired = "chunks_retired"
    bind.execute(text("LOCK TABLE chunks IN SHARE MODE"))  # writers wait, searches go on
    indexes = bind.execute(text(
        "SELECT c.relname AS name, pg_get_indexdef(i.indexrelid) AS definition FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'chunks'::regclass AND NOT i.indisprimary "
        "ORDER BY c.relname")).all()
    triggers = bind.execute(text(
        "SELECT tgname AS name, pg_get_triggerdef(oid) AS definition FROM pg_trigger "
        "WHERE tgrelid = 'chunks'::regclass AND NOT tgisinternal AND tgparentid = 0 ORDER BY tgname")).all()
    # The old names free for the new table (renaming an index does not block reads).
    for index in indexes:
        bind.execute(text(f'ALTER INDEX "{index.name}" RENAME TO "{index.name}_retired"'))
    bind.execute(text("ALTER TABLE chunks RENAME CONSTRAINT chunks_pkey TO chunks_retired_pkey"))
    bind.execute(text(
        f"CREATE TABLE {new} (LIKE chunks INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)"
        + (" PARTITION BY LIST (source_id)" if partitioned else "")))
    if partitioned:
        bind.execute(text(f"ALTER TABLE {new} ADD CONSTRAINT chunks_pkey PRIMARY KEY (id, source_id)"))
        bind.execute(text(f"CREATE TABLE chunks_default PARTITION OF {new} DEFAULT"))
        for (source,) in bind.execute(text("SELECT id FROM sources ORDER BY id")).all():
            bind.execute(text("SELECT chunks_create_partition(CAST(:parent AS regclass), :source)"),
                         {"parent": new, "source": source})
    # Copied in batches in id order: each statement's memory and WAL stay bounded.
    after = 0
    while True:
        upto = bind.execute(text(
            "SELECT max(id) FROM (SELECT id FROM chunks WHERE id > :after ORDER BY id LIMIT :batch) b"),
            {"after": after, "batch": _BATCH}).scalar()
        if upto is None:
            break
        bind.execute(text(f"INSERT INTO {new} SELECT * FROM chunks WHERE id > :after AND id <= :upto"),
                     {"after": after, "upto": upto})
        after = upto
    if not partitioned:
        bind.execute(text(f"ALTER TABLE {new} ADD CONSTRAINT chunks_pkey PRIMARY KEY (id)"))
    bind.execute(text(f"SET LOCAL maintenance_work_mem = '{_index_build_memory(_dimension_rows(bind))}'"))
    for index in indexes:
        # "... ON public.chunks USING ..." (a plain table) or "... ON ONLY public.chunks USING ..." (a partitioned
        # one): the same index on the new table, under the old name.
        definition = index.definition.replace(f"INDEX {index.name}_retired ", f"INDEX {index.name} ", 1)
        definition = definition.replace(" ON ONLY public.chunks ", f" ON public.{new} ", 1)
        definition = definition.replace(" ON public.chunks ", f" ON public.{new} ", 1)
        bind.execute(text(definition))
    bind.execute(text(
        f"ALTER TABLE {new} ADD CONSTRAINT {new}_document_id_fkey FOREIGN KEY (document_id) "
        "REFERENCES documents(id) ON DELETE CASCADE"))
    for trigger in triggers:
        bind.execute(text(trigger.definition.replace(" ON public.chunks ", f" ON public.{new} ", 1)))

    # The swap: searches wait only for these renames and the commit that follows.
    bind.execute(text("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE"))
    bind.execute(text(f"ALTER TABLE chunks RENAME TO {retired}"))
    bind.execute(text(f"ALTER TABLE {new} RENAME TO chunks"))
    bind.execute(text(f"ALTER TABLE chunks RENAME CONSTRAINT {new}_document_id_fkey TO chunks_document_id_fkey"))
    bind.execute(text("ALTER SEQUENCE chunks_id_seq OWNED BY chunks.id"))  # or the drop below would take it along
    bind.execute(text(f"DROP TABLE {retired}"))
    bind.execute(text("ANALYZE chunks"))


def upgrade() -> None:
    bind = op.get_bind()
    bind.execute(text(_CREATE_PARTITION))
    _rebuild(bind, partitioned=True)
    bind.execute(text(
        "CREATE TRIGGER sources_chunks_partition AFTER INSERT ON sources "
        "FOR EACH ROW EXECUTE FUNCTION chunks_partition_for_source()"))


def downgrade() -> None:
    bind = op.get_bind()
    bind.execute(text("DROP TRIGGER IF EXISTS sources_chunks_partition ON sources"))
    _rebuild(bind, partitioned=False)
    bind.execute(text("DROP FUNCTION IF EXISTS chunks_partition_for_source()"))
    bind.execute(text("DROP FUNCTION IF EXISTS chunks_create_partition(regclass, integer)"))
