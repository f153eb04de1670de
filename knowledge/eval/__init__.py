"""Offline evaluation: retrieval metrics on question sets, and the LLM judge for answers."""
