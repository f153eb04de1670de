"""Stored sources (kind, config, checkpoint, schedules) and recorded sync runs.

- `sources` gains `config` (JSON the source's factory rebuilds it from; never secrets, only env-var names),
  `checkpoint` (where the next incremental sync starts), `schedule_seconds` / `prune_seconds` (None: on demand)
  and `last_pruned_at`. Folder sources indexed before this revision get `{"path": location}`, so
  `ragbot sync NAME` works on them at once.
- `documents.version` holds the source's cheap version of what was indexed (prefixed by the pipeline recipe), so
  unchanged items are never fetched again.
- `sync_runs` records every run: trigger, start/end, counts, error.

Revision ID: 0003
Revises: 0001
Create Date: 2026-11-22
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE sources ADD COLUMN IF NOT EXISTS config jsonb NOT NULL DEFAULT '{}'::jsonb;
        ALTER TABLE sources ADD COLUMN IF NOT EXISTS checkpoint text;
        ALTER TABLE sources ADD COLUMN IF NOT EXISTS schedule_seconds integer;
        ALTER TABLE sources ADD COLUMN IF NOT EXISTS prune_seconds integer;
        ALTER TABLE sources ADD COLUMN IF NOT EXISTS last_pruned_at timestamptz;
        UPDATE sources SET config = jsonb_build_object('path', location)
         WHERE kind = 'folder' AND location IS NOT NULL AND config = '{}'::jsonb;

        ALTER TABLE documents ADD COLUMN IF NOT EXISTS version text;

        CREATE TABLE IF NOT EXISTS sync_runs (
            id bigserial PRIMARY KEY,
            source_id integer NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
            trigger text NOT NULL,
            status text NOT NULL DEFAULT 'running',
            started_at timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz,
            full_sync boolean NOT NULL DEFAULT false,
            pruned boolean NOT NULL DEFAULT false,
            added integer NOT NULL DEFAULT 0,
            updated integer NOT NULL DEFAULT 0,
            metadata_updated integer NOT NULL DEFAULT 0,
            deleted integer NOT NULL DEFAULT 0,
            unchanged integer NOT NULL DEFAULT 0,
            skipped integer NOT NULL DEFAULT 0,
            failed integer NOT NULL DEFAULT 0,
            error text,
            details jsonb
        );
        CREATE INDEX IF NOT EXISTS sync_runs_source_started ON sync_runs (source_id, started_at DESC);
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE IF EXISTS sync_runs;
        ALTER TABLE documents DROP COLUMN IF EXISTS version;
        ALTER TABLE sources DROP COLUMN IF EXISTS config, DROP COLUMN IF EXISTS checkpoint,
            DROP COLUMN IF EXISTS schedule_seconds, DROP COLUMN IF EXISTS prune_seconds,
            DROP COLUMN IF EXISTS last_pruned_at;
        """
    )
