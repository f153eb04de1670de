"""Search: dense, lexical (BM25) and hybrid retrieval with fusion; the SQL itself lives in knowledge/storage."""
