"""`ragbot eval`: run the evaluation questions through each retrieval mode and print the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.table import Table

from bot.terminal import RichSyncProgress, console, err_console
from knowledge.evaluation import (
    EVAL_PRINCIPAL, METRICS, evaluate_retrieval, load_beir, load_corpus, load_jsonl_questions,
)
from knowledge.kb import KnowledgeBase
from knowledge.retrieval import SearchFilters


async def run_eval(
    kb: KnowledgeBase, file: Path | None, beir: Path | None, modes: Sequence[str], principals: Sequence[str],
    sources: Sequence[str], *, corpus: Path | None = None, memory: bool = True,
) -> dict[str, dict[str, float]]:
    if beir is not None:
        source, questions = load_beir(beir)
    else:
        assert file is not None
        questions = load_jsonl_questions(file)
        source = load_corpus(corpus) if corpus is not None else None
    if source is not None:
        with RichSyncProgress(source.spec.name) as progress:
            report = await kb.sync(source, progress)
        err_console.print(f"{source.spec.name}: {len(report.added) + len(report.updated)} indexed, {report.unchanged} cached")
        sources = [source.spec.name]  # an eval corpus is searched within itself
        principals = [*principals, EVAL_PRINCIPAL]
    filters = SearchFilters(tuple(principals), tuple(sources) if sources else None)
    return await evaluate_retrieval(kb, questions, modes, filters, memory=memory)


def render_eval(results: dict[str, dict[str, float]]) -> None:
    table = Table("mode", *METRICS)
    for mode, metrics in results.items():
        table.add_row(mode, *(f"{metrics[m]:.4f}" for m in METRICS))
    console.print(table)
