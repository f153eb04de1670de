"""`ragbot eval`: run the evaluation questions through each retrieval mode and print the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.table import Table

from bot.terminal import RichSyncProgress, console, err_console
from knowledge.evaluation import METRICS, load_beir, load_jsonl_questions, mean_metrics, score_ranking
from knowledge.retrieval import SearchFilters


async def run_eval(
    file: Path | None, beir: Path | None, modes: Sequence[str], principals: Sequence[str], sources: Sequence[str]
) -> dict[str, dict[str, float]]:
    from knowledge.kb import KnowledgeBase

    kb = await KnowledgeBase.open()
    try:
        if beir is not None:
            source, questions = load_beir(beir)
            with RichSyncProgress(source.spec.name) as progress:
                report = await kb.sync(source, progress)
            err_console.print(
                f"{source.spec.name}: {len(report.added) + len(report.updated)} indexed, {report.unchanged} cached"
            )
            sources = [source.spec.name]
        else:
            assert file is not None
            questions = load_jsonl_questions(file)
        answerable = [q for q in questions if q.relevant]
        filters = SearchFilters(tuple(principals), tuple(sources) if sources else None)
        results: dict[str, dict[str, float]] = {}
        for mode in modes:
            per_question = []
            for q in answerable:
                found = await kb.search(q.question, filters, k=100, mode=mode, max_per_document=1,  # type: ignore[arg-type]
                                        )
                per_question.append(score_ranking([h.external_id for h in found.hits], q.relevant))
            results[mode] = {metric: round(value, 4) for metric, value in mean_metrics(per_question).items()}
        return results
    finally:
        await kb.close()


def render_eval(results: dict[str, dict[str, float]]) -> None:
    table = Table("mode", *METRICS)
    for mode, metrics in results.items():
        table.add_row(mode, *(f"{metrics[m]:.4f}" for m in METRICS))
    console.print(table)
