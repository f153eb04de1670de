"""Answering: the question (rewritten with the conversation) -> retrieved passages -> a cited answer or an abstention."""
