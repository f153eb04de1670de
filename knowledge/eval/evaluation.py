"""Retrieval evaluation over documents: a document ranks where its best chunk ranks.

Two inputs: ragbot's own JSONL (`{"question", "relevant": [external ids]}` per line, optionally with the
conversation before it, `"history": [{"role": "user"|"assistant", "text"}, ...]`; questions with no relevant
documents are unanswerable and are left out of ranking metrics) and the BEIR layout (`corpus.jsonl`,
`queries.jsonl`, `qrels/test.tsv`), whose corpus is ingested as its own source and searched within it. A JSONL
question file can also be paired with a BEIR-style `corpus.jsonl` alone (`load_corpus`).

With history, retrieval searches the memory's standalone rewrite of the question (what a follow-up in a chat
would search); `memory=False` searches the last question alone, the baseline the rewrite must beat.
Metrics follow the usual definitions (pytrec_eval's, as BEIR reports them): nDCG@10 with linear gains from the
qrels' grades, MAP@100 and recall over all relevant documents.
"""

from __future__ import annotations

import csv
import json
import math
import re
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

from knowledge.eval.judging import AnswerJudge, Judgement, JudgeError
from knowledge.answer.memory import ChatMessage
from knowledge.errors import EvalFileError
from knowledge.sources.base import SourceItem, SourceSpec, StaticSource

METRICS = ("ndcg@10", "recall@100", "mrr@10", "map@100", "precision@5", "recall@10")
# BEIR corpora are indexed for this principal only, so benchmark documents never turn up in anyone's answers.
EVAL_PRINCIPAL = "group:ragbot-eval"


@dataclass(frozen=True)
class EvalQuestion:
    id: str
    question: str
    relevant: dict[str, int]  # external id -> grade (> 0)
    kind: str = ""  # free-form label from the file, e.g. "paraphrased", "off_topic", "near_miss"
    history: tuple[ChatMessage, ...] = ()  # the conversation before the question, oldest first
    facts: tuple[str, ...] = ()  # what a right answer must state, e.g. ("15 days",): scored by `--answers`


def load_jsonl_questions(path: Path) -> list[EvalQuestion]:
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            question = str(record["question"]).strip()
            relevant = [str(r) for r in record.get("relevant", [])]
            history = tuple(_message(m) for m in record.get("history", []))
            facts = tuple(str(f) for f in record.get("facts", []))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise EvalFileError(
                f"{path}:{number}: expected {{\"history\": [{{\"role\": \"user\"|\"assistant\", \"text\": ...}}], "
                f"\"question\": ..., \"relevant\": [...]}} (history optional): {exc}"
            ) from exc
        if not question:
            raise EvalFileError(f"{path}:{number}: empty question")
        questions.append(
            EvalQuestion(str(number), question, {r: 1 for r in relevant}, str(record.get("kind", "")), history, facts)
        )
    return questions


def _message(record: object) -> ChatMessage:
    if not isinstance(record, dict) or record.get("role") not in ("user", "assistant"):
        raise ValueError(f"a history message needs a role of user or assistant: {record!r}")
    return ChatMessage(record["role"], str(record.get("text", "")))


def _read_jsonl(path: Path) -> Iterable[dict]:  # type: ignore[type-arg]
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def load_beir(directory: Path, split: str = "test") -> tuple[StaticSource, list[EvalQuestion]]:
    corpus, queries, qrels_path = directory / "corpus.jsonl", directory / "queries.jsonl", directory / "qrels" / f"{split}.tsv"
    for required in (corpus, queries, qrels_path):
        if not required.exists():
            raise EvalFileError(f"{required} is missing: a BEIR folder has corpus.jsonl, queries.jsonl, qrels/{split}.tsv")
    relevant: dict[str, dict[str, int]] = {}
    with qrels_path.open(encoding="utf-8") as handle:
        for row in csv.reader(handle, delimiter="\t"):
            if len(row) < 3 or row[0] in ("query-id", "query_id"):
                continue
            if int(row[2]) > 0:
                relevant.setdefault(row[0], {})[row[1]] = int(row[2])
    texts = {str(r["_id"]): str(r["text"]) for r in _read_jsonl(queries)}
    questions = [EvalQuestion(qid, texts[qid], rel) for qid, rel in relevant.items() if qid in texts]
    return _corpus_source(corpus, f"beir-{directory.resolve().name}", f"beir/{directory.name}", directory), questions


def load_corpus(path: Path) -> StaticSource:
    """A BEIR-style corpus file (`{"_id", "title", "text"}` per line) as an eval-only source; its `_id`s are the
    external ids a question file's `relevant` lists name."""
    if not path.is_file():
        raise EvalFileError(f"{path} is not a file: --corpus takes a JSONL file of {{\"_id\", \"title\", \"text\"}} lines")
    resolved = path.resolve()
    return _corpus_source(path, f"corpus-{resolved.parent.name}-{resolved.stem}", f"corpus/{resolved.stem}", path)


def _corpus_source(corpus: Path, name: str, display_path: str, location: Path) -> StaticSource:
    """Indexed for the eval principal only, so benchmark documents never turn up in anyone's answers."""
    items = []
    try:
        for record in _read_jsonl(corpus):
            body = str(record.get("text", ""))
            items.append(
                SourceItem(
                    external_id=str(record["_id"]),
                    filename=f"{record['_id']}.txt",
                    read=(lambda body=body: body.encode("utf-8")),
                    title=str(record.get("title") or "").strip() or None,
                    path=display_path,
                    access=(EVAL_PRINCIPAL,),
                )
            )
    except (json.JSONDecodeError, KeyError) as exc:
        raise EvalFileError(f"{corpus}: expected one {{\"_id\", \"title\", \"text\"}} object per line: {exc}") from exc
    return StaticSource(SourceSpec(name=name, kind="beir", location=str(location.resolve())), items)


def score_ranking(ranked: Sequence[str], relevant: dict[str, int]) -> dict[str, float]:
    """All metrics for one question, given document ids in rank order."""
    rel_total = len(relevant)
    hits = [1 if doc in relevant else 0 for doc in ranked]
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:10]))
    ideal = sorted(relevant.values(), reverse=True)[:10]
    idcg = sum(grade / math.log2(i + 2) for i, grade in enumerate(ideal))
    first = next((i for i, h in enumerate(hits[:10]) if h), None)
    precision_sum, found = 0.0, 0
    for i, hit in enumerate(hits[:100]):
        if hit:
            found += 1
            precision_sum += found / (i + 1)
    return {
        "ndcg@10": dcg / idcg if idcg else 0.0,
        "recall@100": sum(hits[:100]) / rel_total,
        "mrr@10": 1.0 / (first + 1) if first is not None else 0.0,
        "map@100": precision_sum / rel_total,
        "precision@5": sum(hits[:5]) / 5,
        "recall@10": sum(hits[:10]) / rel_total,
    }


def mean_metrics(per_question: Sequence[dict[str, float]]) -> dict[str, float]:
    if not per_question:
        return {metric: 0.0 for metric in METRICS}
    return {metric: sum(q[metric] for q in per_question) / len(per_question) for metric in METRICS}


async def search_queries(kb, questions: Sequence[EvalQuestion], memory: bool = True) -> list[str]:  # type: ignore[no-untyped-def]
    """What each question searches: with memory, the standalone rewrite given its history (the question itself
    when it has none); without, the last question alone."""
    queries = []
    for question in questions:
        if memory and question.history:
            history = kb.memory.history_from_messages(list(question.history))
            queries.append((await kb.memory.standalone_query(question.question, history)).query)
        else:
            queries.append(question.question)
    return queries


async def evaluate_retrieval(
    kb, questions: Sequence[EvalQuestion], modes: Sequence[str], filters, memory: bool = True  # type: ignore[no-untyped-def]
) -> dict[str, dict[str, float]]:
    """Mean metrics per mode over the answerable questions; each document ranks where its best chunk ranks."""
    answerable = [q for q in questions if q.relevant]
    queries = await search_queries(kb, answerable, memory)
    results: dict[str, dict[str, float]] = {}
    for mode in modes:
        per_question = []
        for question, query in zip(answerable, queries, strict=True):
            found = await kb.search(query, filters, k=100, mode=mode, max_per_document=1)
            per_question.append(score_ranking([hit.external_id for hit in found.hits], question.relevant))
        results[mode] = {metric: round(value, 4) for metric, value in mean_metrics(per_question).items()}
    return results


# --- answers ---------------------------------------------------------------------------------------------------

ANSWER_METRICS = (
    "answered", "fact_recall", "right_document", "no_unrelated_source", "wrongly_declined",
    "near_miss_declined", "off_topic_declined",
)


@dataclass(frozen=True)
class AnswerScore:
    """How one answer did. `facts_found`/`right_document`/`unrelated_sources` only count for answerable ones."""

    question: EvalQuestion
    abstained: bool
    facts_found: int
    right_document: bool
    unrelated_sources: int
    cited: tuple[str, ...]
    judgement: Judgement | None = None  # the LLM judge's grades (answered questions, when an LLM is configured)
    judge_error: str | None = None


def _plain(text: str) -> str:
    """Answer text without Markdown emphasis and with single spaces, so a fact matches however it was styled."""
    return " ".join(re.sub(r"[*_`\\]", "", text).split()).casefold()


def score_answer(question: EvalQuestion, answer) -> AnswerScore:  # type: ignore[no-untyped-def]
    cited = tuple(c.external_id for c in answer.citations)
    text = _plain(answer.text)
    found = sum(1 for fact in question.facts if _plain(fact) in text) if not answer.abstained else 0
    return AnswerScore(
        question, answer.abstained, found, bool(set(cited) & set(question.relevant)),
        sum(1 for c in cited if c not in question.relevant), cited,
    )


def summarise_answers(scores: Sequence[AnswerScore]) -> dict[str, float]:
    """Offline scoring of answers against the eval file's expected facts and documents:
    - answered: share of answerable questions that got an answer (not an abstention);
    - fact_recall: share of the expected facts found in the answer text, over all answerable questions;
    - right_document: share of answerable questions whose answer cites a relevant document;
    - no_unrelated_source: share of answered questions that cite no document outside `relevant`;
    - wrongly_declined: answerable questions that abstained (count);
    - near_miss_declined / off_topic_declined: share of unanswerable questions of that kind that abstained."""
    answerable = [s for s in scores if s.question.relevant]
    answered = [s for s in answerable if not s.abstained]
    facts_total = sum(len(s.question.facts) for s in answerable)

    def declined(kind: str) -> float:
        of_kind = [s for s in scores if not s.question.relevant and s.question.kind == kind]
        return round(sum(s.abstained for s in of_kind) / len(of_kind), 4) if of_kind else 0.0

    return {
        "answerable": len(answerable),
        "answered": round(len(answered) / len(answerable), 4) if answerable else 0.0,
        "fact_recall": round(sum(s.facts_found for s in answerable) / facts_total, 4) if facts_total else 0.0,
        "right_document": round(sum(s.right_document for s in answerable) / len(answerable), 4) if answerable else 0.0,
        "no_unrelated_source": (
            round(sum(s.unrelated_sources == 0 for s in answered) / len(answered), 4) if answered else 0.0
        ),
        "wrongly_declined": len(answerable) - len(answered),
        "near_miss_declined": declined("near_miss"),
        "off_topic_declined": declined("off_topic"),
        "abstention_accuracy": _abstention_accuracy(scores),
        **_judged_metrics(answered),
    }


def _abstention_accuracy(scores: Sequence[AnswerScore]) -> float:
    """Share of unanswerable questions (no `relevant` documents) that the bot declined to answer."""
    unanswerable = [s for s in scores if not s.question.relevant]
    return round(sum(s.abstained for s in unanswerable) / len(unanswerable), 4) if unanswerable else 0.0


def _judged_metrics(answered: Sequence[AnswerScore]) -> dict[str, float]:
    """The LLM judge's metrics, means over the answered answerable questions it graded (see knowledge/eval/judging.py)."""
    judged = [s.judgement for s in answered if s.judgement is not None]
    if not judged and not any(s.judge_error for s in answered):
        return {}
    contexts = [j.context_relevance for j in judged if j.context_relevance is not None]

    def mean(values: Sequence[float]) -> float:
        return round(sum(values) / len(values), 4) if values else 0.0

    return {
        "faithfulness": mean([j.faithfulness for j in judged]),
        "answer_relevance": mean([j.answer_relevance for j in judged]),
        "context_relevance": mean(contexts),
        "judged": len(judged),
        "unjudged": sum(1 for s in answered if s.judge_error),
    }


async def evaluate_answers(
    kb, questions: Sequence[EvalQuestion], principals: Sequence[str], sources: Sequence[str] | None = None,  # type: ignore[no-untyped-def]
    judge: AnswerJudge | None = None,
) -> tuple[dict[str, float], list[AnswerScore]]:
    """Ask every question through the full answer pipeline (offline unless an API key is set) and score it; with a
    judge, every answered answerable question is also graded for faithfulness and relevance."""
    scores = []
    run = uuid.uuid4().hex[:12]
    for number, question in enumerate(questions):
        # Each question is its own conversation, new in every run: with one shared id, every question was read as
        # a follow-up of the ones before it (of earlier runs too), and answers depended on what ran before.
        answer = await kb.answer(question.question, principals, f"eval:answers:{run}:{number}", sources=sources,
                                 prior_messages=list(question.history) or None)
        score = score_answer(question, answer)
        if judge is not None and question.relevant and not answer.abstained:
            passages = [f"{hit.title}: {hit.text}" for hit in answer.chunks_used]
            try:
                score = replace(score, judgement=await judge.judge(question.question, passages, answer.text))
            except JudgeError as exc:
                score = replace(score, judge_error=str(exc))
        scores.append(score)
    return summarise_answers(scores), scores
