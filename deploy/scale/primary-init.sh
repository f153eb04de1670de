#!/bin/sh
# Run once by the postgres image when the primary's data folder is created (/docker-entrypoint-initdb.d): a role the
# standby streams with, and the pg_hba line letting it. wal_level is `replica` by default (Postgres 10 and later).
set -e
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" <<SQL
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD '${REPLICATION_PASSWORD:-replicator}';
SQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
