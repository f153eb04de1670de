"""`ragbot eval`: run the evaluation questions through each retrieval mode and print the metrics."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from bot.cli.terminal import RichSyncProgress, console, err_console
from knowledge import EvalFileError, KnowledgeBase, Mode, SearchFilters, StaticSource
from knowledge.eval.evaluation import (
    EVAL_PRINCIPAL,
    METRICS,
    compare_memory,
    evaluate_answers,
    evaluate_retrieval,
    load_beir,
    load_corpus,
    load_jsonl_questions,
)


async def run_eval(
    kb: KnowledgeBase, file: Path | None, beir: Path | None, modes: Sequence[Mode], principals: Sequence[str],
    sources: Sequence[str], *, corpus: Path | None = None, memory: bool = True, strategy: str | None = None,
) -> dict[str, dict[str, float]]:
    source: StaticSource | None
    if beir is not None:
        source, questions = load_beir(beir)
    else:
        assert file is not None
        questions = load_jsonl_questions(file)
        source = load_corpus(corpus) if corpus is not None else None
        if source is None:
            await require_an_index(kb, file)
    if source is not None:
        principals, sources = await index_eval_corpus(kb, source, principals)
    filters = SearchFilters(tuple(principals), tuple(sources) if sources else None)
    return await evaluate_retrieval(kb, questions, modes, filters, memory=memory, strategy=strategy)


async def index_eval_corpus(
    kb: KnowledgeBase, source: StaticSource, principals: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Sync an eval corpus (only what changed is re-indexed) and return the principals and sources to search it
    with: an eval corpus is searched, and answered from, within itself."""
    with RichSyncProgress(source.spec.name) as progress:
        report = await kb.sync(source, progress)
    err_console.print(f"{source.spec.name}: {len(report.added) + len(report.updated)} indexed, {report.unchanged} cached")
    return [*principals, EVAL_PRINCIPAL], [source.spec.name]


async def run_memory_comparison(
    kb: KnowledgeBase, file: Path, principals: Sequence[str], sources: Sequence[str], *, corpus: Path | None = None,
) -> dict[str, dict[str, float]]:
    """`ragbot eval FILE --compare-memory`: memory against the last question and the last two user turns."""
    questions = load_jsonl_questions(file)
    if corpus is not None:
        principals, sources = await index_eval_corpus(kb, load_corpus(corpus), principals)
    else:
        await require_an_index(kb, file)
    return await compare_memory(kb, questions, principals, sources or None)


def render_memory_comparison(table: dict[str, dict[str, float]]) -> None:
    columns = ("ndcg@10", "recall@10", "fact_recall", "right_document")
    out = Table("search", *columns)
    for strategy, figures in table.items():
        out.add_row(strategy, *(f"{figures[c]:.4f}" if c in figures else "-" for c in columns))
    console.print(out)


def render_eval(results: dict[str, dict[str, float]]) -> None:
    table = Table("mode", *METRICS)
    for mode, metrics in results.items():
        table.add_row(mode, *(f"{metrics[m]:.4f}" for m in METRICS))
    console.print(table)


async def require_an_index(kb: KnowledgeBase, file: Path, *, corpus_option: bool = True) -> None:
    """An empty index would score every question 0 (and, for --answers, decline every one, which scores as perfect
    abstention): say what to index instead."""
    if (await kb.status()).chunks == 0:
        raise EvalFileError(
            f"the index is empty, so there is nothing to evaluate: first index the documents {file.name}'s "
            "questions are about (for the example handbook: ragbot ingest examples/handbook)"
            + (", or pass --corpus with the documents (a folder or a corpus.jsonl)" if corpus_option else "")
        )


async def run_answer_eval(
    kb: KnowledgeBase, file: Path, principals: Sequence[str], sources: Sequence[str], *, corpus: Path | None = None,
) -> dict[str, object]:
    """Answer every question of `file` and score the answers; with `corpus`, that corpus is indexed as an eval
    source first and the questions are answered from it alone (as retrieval eval searches it alone)."""
    questions = load_jsonl_questions(file)
    if corpus is not None:
        principals, sources = await index_eval_corpus(kb, load_corpus(corpus), principals)
    else:
        await require_an_index(kb, file)
    judge = None
    if kb.answerer.generator is not None:  # an LLM answers, so an LLM grades too (faithfulness, relevance)
        from knowledge.eval.judging import AnswerJudge  # deferred: only --judge needs the Claude client

        judge = AnswerJudge(kb.settings)
    try:
        summary, scores = await evaluate_answers(kb, questions, principals, sources or None, judge)
    finally:
        if judge is not None:
            await judge.close()
    return {
        "mode": "llm" if kb.answerer.generator else "extractive",
        **summary,
        "misses": [
            {"question": s.question.question, "kind": s.question.kind, "outcome": s.result,
             "abstained": s.abstained,
             "facts_found": s.facts_found, "facts": list(s.question.facts), "cited": list(s.cited),
             **({"faithfulness": round(s.judgement.faithfulness, 4)} if s.judgement else {}),
             **({"judge_error": s.judge_error} if s.judge_error else {})}
            for s in scores
            if (s.question.relevant and (s.result != "answer" or s.facts_found < len(s.question.facts) or not s.right_document
                                         or s.judge_error or (s.judgement and s.judgement.faithfulness < 1)))
            or (not s.question.relevant and s.result != "decline")
        ],
    }


def render_answer_eval(summary: dict[str, object]) -> None:
    table = Table("metric", "value")
    for key, value in summary.items():
        if key not in ("misses", "by_side", "by_category"):
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    groups = {**_figures(summary.get("by_side")), **_figures(summary.get("by_category"))}
    if groups:
        columns = ("questions", "answered", "uncertain", "declined", "right_document", "fact_recall", "quote_length",
                   "credit")
        by_group = Table("questions", *columns)
        for name, figures in groups.items():
            by_group.add_row(name, *(_cell(figures.get(c)) for c in columns))
        console.print(by_group)
    misses = summary.get("misses")
    if isinstance(misses, list) and misses:
        console.print(f"{len(misses)} questions to look at (--json lists them).")


def _figures(groups: object) -> dict[str, dict[str, float]]:
    """A summary's `by_side` or `by_category` (figures per group), or nothing when the summary has none."""
    return groups if isinstance(groups, dict) else {}


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)
