"""Every SQL statement of `knowledge/`: documents, chunks and BM25 terms, vectors, sources, sync runs, conversations."""
