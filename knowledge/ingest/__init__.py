"""Ingestion: parse a file, chunk it, embed and store the chunks (pipeline), sync a source (runs), on a schedule."""
