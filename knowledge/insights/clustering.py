"""Group questions by topic: average-linkage agglomerative clustering of their embeddings, cut at a similarity.

Platform-neutral and pure NumPy: the gaps report (`bot.chat.insights`) embeds the questions the bot declined,
answered as uncertain or got a 👎 on with the project's own encoder and calls `cluster_questions`. Each cluster is
named by its most central question (the one with the highest mean cosine similarity to the others).

Why average linkage with a threshold: the number of topics is unknown; single linkage chains unrelated questions
through one bridging question; a fixed k splits a big topic or merges small ones. Two groups merge while the mean
cosine similarity between their questions is at least `threshold`.

DEFAULT_THRESHOLD was tuned on a generated tuning set (8 topics × 25 templated paraphrases: parental leave, health
insurance, printers, badges, onboarding, travel booking, code review, sick leave; tests/test_insights_clustering.py
TUNING_TOPICS; all-MiniLM-L6-v2). Matched accuracy (one-to-one cluster↔topic assignment) on that tuning set:
0.25: 0.850, 0.27–0.30: 0.975, 0.31–0.35: 0.95–0.925, 0.40: 0.825, 0.50: 0.625; 0.30 is the top of the plateau.
On the held-out set (TEST_TOPICS, 8 other topics) 0.30 gives 0.850 with 7 clusters (the test asserts ≥ 0.8).

Cost: O(n²) memory and O(n³) worst-case time; callers cap n (MAX_QUESTIONS) and run it off the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_THRESHOLD = 0.30
MAX_QUESTIONS = 1000


@dataclass(frozen=True)
class Cluster:
    members: tuple[int, ...]  # indexes into the input, in input order
    central: int  # the member with the highest mean similarity to the others: the cluster's name


def _normalised(vectors: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    matrix = np.asarray(vectors, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError("expected one vector per question")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


def cluster_questions(vectors: Sequence[Sequence[float]] | np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> list[Cluster]:
    """Clusters of the given question vectors, largest first (ties: the one holding the earliest question)."""
    n = len(vectors)
    if n == 0:
        return []
    if n > MAX_QUESTIONS:
        raise ValueError(f"at most {MAX_QUESTIONS} questions can be clustered at once, got {n}")
    x = _normalised(vectors)
    similarity = x @ x.T
    linkage = similarity.copy()
    np.fill_diagonal(linkage, -np.inf)
    sizes = np.ones(n)
    members: list[list[int] | None] = [[i] for i in range(n)]
    while n > 1:
        flat = int(np.argmax(linkage))
        i, j = divmod(flat, linkage.shape[1])
        if linkage[i, j] < threshold:
            break
        if i > j:
            i, j = j, i
        # Lance-Williams for average linkage: the merged group's mean similarity to every other group.
        merged = (sizes[i] * linkage[i] + sizes[j] * linkage[j]) / (sizes[i] + sizes[j])
        linkage[i, :] = merged
        linkage[:, i] = merged
        linkage[i, i] = -np.inf
        linkage[j, :] = -np.inf
        linkage[:, j] = -np.inf
        sizes[i] += sizes[j]
        kept, merged_in = members[i], members[j]
        assert kept is not None and merged_in is not None  # both still groups: their linkage was not -inf
        members[i] = kept + merged_in
        members[j] = None
    clusters = []
    for group in members:
        if group is None:
            continue
        group = sorted(group)
        if len(group) == 1:
            central = group[0]
        else:
            inner = similarity[np.ix_(group, group)]
            central = group[int(np.argmax((inner.sum(axis=1) - 1.0) / (len(group) - 1)))]
        clusters.append(Cluster(tuple(group), central))
    clusters.sort(key=lambda c: (-len(c.members), c.members[0]))
    return clusters
