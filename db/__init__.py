"""Storage for ragbot: settings, the embedded Postgres, the SQLAlchemy engine, models and migrations.

Nothing in here knows about Slack, Discord or how retrieval ranks things; it only stores and serves rows.
"""
