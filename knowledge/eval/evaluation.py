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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knowledge.answer.memory import ChatMessage
from knowledge.errors import EvalFileError, JudgeError
from knowledge.eval.judging import AnswerJudge, Judgement
from knowledge.ingest.parsing import SUPPORTED_SUFFIXES
from knowledge.search.fusion import Reading
from knowledge.search.retrieval import Mode, SearchFilters
from knowledge.sources.base import SourceItem, SourceSpec, StaticSource, bytes_read
from knowledge.sources.folder import FolderSource

if TYPE_CHECKING:
    from knowledge.answer.answering import Answer
    from knowledge.kb import KnowledgeBase

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


def _read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
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
    """An eval-only source for `--corpus`: either a BEIR-style corpus file (`{"_id", "title", "text"}` per line),
    whose `_id`s are the external ids a question file's `relevant` lists name, or a folder of documents (such as
    `examples/tidewater`), whose external ids are the files' paths under the folder, as `ragbot ingest` names them."""
    if path.is_dir():
        return load_folder_corpus(path)
    if not path.is_file():
        raise EvalFileError(
            f"{path} is not a file: --corpus takes a folder of documents or a JSONL file of "
            "{\"_id\", \"title\", \"text\"} lines"
        )
    resolved = path.resolve()
    return _corpus_source(path, f"corpus-{resolved.parent.name}-{resolved.stem}", f"corpus/{resolved.stem}", path)


def load_folder_corpus(folder: Path) -> StaticSource:
    """A folder of documents as an eval-only source: read as `ragbot ingest` reads it (same external ids, versions
    and parsers), but shared with the eval principal only, whatever its `.access` files say, and kept apart from
    a folder source of the same files (its own source name), so it is searched within itself and never answers
    anyone. Files that are not documents (the folder's own eval.jsonl, conversations.jsonl) are left out."""
    folder_source = FolderSource(folder)
    items = [
        replace(item, access=(EVAL_PRINCIPAL,), path=f"corpus/{folder_source.root.name}/{item.external_id}")
        for item in folder_source.items()
        if Path(item.filename).suffix.lower() in SUPPORTED_SUFFIXES
    ]
    if not items:
        raise EvalFileError(f"{folder} holds no documents ragbot reads ({', '.join(SUPPORTED_SUFFIXES)})")
    spec = SourceSpec(name=f"corpus-{folder_source.root.name}", kind="eval-folder", location=str(folder_source.root))
    return StaticSource(spec, items)


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
                    read=bytes_read(body.encode("utf-8")),
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


QUERY_STRATEGIES = ("memory", "last", "last-two")


def last_two_user_turns(question: EvalQuestion) -> str:
    """The previous user turn and the question, joined: the simple baseline a memory rewrite has to beat."""
    earlier = [m.text for m in question.history if m.role == "user"]
    return f"{earlier[-1]} {question.question}" if earlier else question.question


async def search_queries(
    kb: KnowledgeBase, questions: Sequence[EvalQuestion], memory: bool = True, strategy: str | None = None
) -> list[tuple[Reading, ...]]:
    """What each question searches (one reading, or several fused). `strategy` "memory" (the default when `memory`
    is true): the memory's readings given its history (multi-query retrieval; the question itself when it has
    none); "last" (`memory=False`): the last question alone; "last-two": the last two user turns together."""
    strategy = strategy or ("memory" if memory else "last")
    if strategy not in QUERY_STRATEGIES:
        raise ValueError(f"unknown query strategy {strategy!r}: one of {', '.join(QUERY_STRATEGIES)}")
    queries: list[tuple[Reading, ...]] = []
    for question in questions:
        if strategy == "last-two":
            queries.append((Reading(last_two_user_turns(question)),))
        elif strategy == "memory" and question.history:
            history = kb.memory.history_from_messages(list(question.history))
            queries.append((await kb.memory.standalone_query(question.question, history)).searches())
        else:
            queries.append((Reading(question.question),))
    return queries


async def evaluate_retrieval(
    kb: KnowledgeBase, questions: Sequence[EvalQuestion], modes: Sequence[Mode], filters: SearchFilters, memory: bool = True,
    strategy: str | None = None,
) -> dict[str, dict[str, float]]:
    """Mean metrics per mode over the answerable questions; each document ranks where its best chunk ranks."""
    answerable = [q for q in questions if q.relevant]
    queries = await search_queries(kb, answerable, memory, strategy)
    results: dict[str, dict[str, float]] = {}
    for mode in modes:
        per_question = []
        for question, readings in zip(answerable, queries, strict=True):
            if len(readings) == 1:
                found = await kb.search(readings[0].query, filters, k=100, mode=mode, max_per_document=1)
            else:
                found = await kb.retriever.search_readings(readings, filters, k=100, mode=mode, max_per_document=1)
            per_question.append(score_ranking([hit.external_id for hit in found.hits], question.relevant))
        results[mode] = {metric: round(value, 4) for metric, value in mean_metrics(per_question).items()}
    return results


async def compare_memory(
    kb: KnowledgeBase, questions: Sequence[EvalQuestion], principals: Sequence[str], sources: Sequence[str] | None,
    *, answers: bool = True,
) -> dict[str, dict[str, float]]:
    """Conversation memory against the naive baselines, in one run: for each strategy (memory, the last question
    alone, the last two user turns) hybrid nDCG@10 and recall@10 over the answerable questions and, with
    `answers`, the share of expected facts the answers quote (the baselines answer the last question, or the last
    two user turns as one question, without history). Measured over the follow-ups (questions with history)."""
    follow_ups = [q for q in questions if q.history]
    filters = SearchFilters(tuple(principals), tuple(sources) if sources else None)
    table: dict[str, dict[str, float]] = {}
    for strategy in QUERY_STRATEGIES:
        retrieval = (await evaluate_retrieval(kb, follow_ups, ("hybrid",), filters, strategy=strategy))["hybrid"]
        row = {"ndcg@10": retrieval["ndcg@10"], "recall@10": retrieval["recall@10"]}
        if answers and any(q.facts for q in follow_ups):  # a set without expected facts has no answers to score
            summary, _ = await evaluate_answers(kb, follow_ups, principals, sources, strategy=strategy)
            row["fact_recall"] = float(summary["fact_recall"])  # type: ignore[arg-type]  # a float by construction
            row["right_document"] = float(summary["right_document"])  # type: ignore[arg-type]
        table[strategy] = row
    return table


# --- answers ---------------------------------------------------------------------------------------------------

ANSWER_METRICS = (
    "answered", "fact_recall", "right_document", "no_unrelated_source", "wrongly_declined",
    "near_miss_declined", "off_topic_declined",
)
OUTCOMES = ("answer", "uncertain", "decline")
# What each outcome earns in the balanced score: an answerable question wants an answer, an unanswerable one a
# decline; a hedge ("closest passages, may not answer") earns half on both sides, so hedging everywhere scores 0.5.
ANSWERABLE_CREDIT = {"answer": 1.0, "uncertain": 0.5, "decline": 0.0}
UNANSWERABLE_CREDIT = {"answer": 0.0, "uncertain": 0.5, "decline": 1.0}


def outcome_of(answer: Answer) -> str:
    """The answer's outcome: its own `outcome` ("answer" | "uncertain" | "decline") when it carries one, else
    derived from `abstained` (an abstention is a decline, anything else an answer)."""
    outcome = getattr(answer, "outcome", None)
    if outcome is None:
        return "decline" if answer.abstained else "answer"
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown answer outcome {outcome!r}: one of {', '.join(OUTCOMES)}")
    return str(outcome)


@dataclass(frozen=True)
class AnswerScore:
    """How one answer did. `facts_found`/`right_document`/`unrelated_sources` only count for answerable ones.
    `retrieved_first`: whether the hybrid search of what the answer searched ranked a relevant document first
    (None when not measured), so answers can be judged against what retrieval handed them."""

    question: EvalQuestion
    abstained: bool
    facts_found: int
    right_document: bool
    unrelated_sources: int
    cited: tuple[str, ...]
    judgement: Judgement | None = None  # the LLM judge's grades (answered questions, when an LLM is configured)
    judge_error: str | None = None
    outcome: str = ""  # "answer" | "uncertain" | "decline"; empty means derived from `abstained`
    retrieved_first: bool | None = None
    quote_length: int = 0  # characters quoted (see `quoted_characters`); 0 for a decline

    @property
    def result(self) -> str:
        return self.outcome or ("decline" if self.abstained else "answer")

    @property
    def credit(self) -> float:
        """This question's share of the balanced score (see ANSWERABLE_CREDIT)."""
        return (ANSWERABLE_CREDIT if self.question.relevant else UNANSWERABLE_CREDIT)[self.result]


def _plain(text: str) -> str:
    """Answer text without Markdown emphasis and with single spaces, so a fact matches however it was styled."""
    return " ".join(re.sub(r"[*_`\\]", "", text).split()).casefold()


_NOTE_LINE = re.compile(r"^\s*(?:_.*_|\*\*.*\*\*.*\[\d+\]|\|[-| ]+\|)\s*$")


def quoted_characters(text: str) -> int:
    """Characters of an answer that quote (or state) something: its text without the offline answer's notes
    (italic lines), its "**Title** › Section [n]" lines and table rules. What keeps "quote the whole table" from
    passing as fact recall."""
    return sum(len(line.strip()) for line in text.splitlines() if line.strip() and not _NOTE_LINE.match(line))


def score_answer(question: EvalQuestion, answer: Answer) -> AnswerScore:
    cited = tuple(c.external_id for c in answer.citations)
    text = _plain(answer.text)
    outcome = outcome_of(answer)
    found = sum(1 for fact in question.facts if _plain(fact) in text) if outcome != "decline" else 0
    return AnswerScore(
        question, outcome == "decline", found, bool(set(cited) & set(question.relevant)),
        sum(1 for c in cited if c not in question.relevant), cited, outcome=outcome,
        quote_length=quoted_characters(answer.text) if outcome != "decline" else 0,
    )


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def _outcome_shares(scores: Sequence[AnswerScore]) -> dict[str, float]:
    return {
        "answered": _share(sum(s.result == "answer" for s in scores), len(scores)),
        "uncertain": _share(sum(s.result == "uncertain" for s in scores), len(scores)),
        "declined": _share(sum(s.result == "decline" for s in scores), len(scores)),
    }


def quote_length(scores: Sequence[AnswerScore]) -> float:
    """Mean characters quoted per reply that quoted anything (answers and `uncertain` replies)."""
    replies = [s for s in scores if s.result != "decline"]
    return round(sum(s.quote_length for s in replies) / len(replies), 1) if replies else 0.0


def _mean_credit(scores: Sequence[AnswerScore]) -> float:
    return round(sum(s.credit for s in scores) / len(scores), 4) if scores else 0.0


def balanced_score(scores: Sequence[AnswerScore]) -> float:
    """The mean credit over answerable questions (answered 1, uncertain ½, declined 0) and over unanswerable ones
    (declined 1, uncertain ½, answered 0), averaged; a side with no questions is left out of the average."""
    sides = [[s for s in scores if s.question.relevant], [s for s in scores if not s.question.relevant]]
    means = [sum(s.credit for s in side) / len(side) for side in sides if side]
    return round(sum(means) / len(means), 4) if means else 0.0


def _answerable_side(answerable: Sequence[AnswerScore]) -> dict[str, float]:
    facts_total = sum(len(s.question.facts) for s in answerable)
    measured = [s for s in answerable if s.retrieved_first is not None]
    first = [s for s in measured if s.retrieved_first]
    side: dict[str, float] = {
        "questions": len(answerable),
        **_outcome_shares(answerable),
        "right_document": _share(sum(s.right_document for s in answerable), len(answerable)),
        "fact_recall": _share(sum(s.facts_found for s in answerable), facts_total),
        "quote_length": quote_length(answerable),
        "credit": _mean_credit(answerable),
    }
    if measured:
        # The issue's yardstick: when retrieval ranked a relevant document first, does the answer cite one?
        side["retrieved_first"] = len(first)
        side["right_document_when_retrieved_first"] = _share(sum(s.right_document for s in first), len(first))
    return side


def _unanswerable_side(unanswerable: Sequence[AnswerScore]) -> dict[str, float]:
    return {
        "questions": len(unanswerable),
        **_outcome_shares(unanswerable),
        "abstention_accuracy": _share(sum(s.result == "decline" for s in unanswerable), len(unanswerable)),
        "declined_or_uncertain": _share(sum(s.result != "answer" for s in unanswerable), len(unanswerable)),
        "quote_length": quote_length(unanswerable),
        "credit": _mean_credit(unanswerable),
    }


def summarise_by_category(scores: Sequence[AnswerScore]) -> dict[str, dict[str, float]]:
    """The same figures per category (the eval file's `kind`; "" is reported as "unlabelled"), each category on
    its own side: answerable categories get answered/uncertain/declined, right_document, fact_recall and their mean
    credit; unanswerable ones (near_miss, off_topic) the outcome shares, abstention accuracy and credit."""
    groups: dict[tuple[str, bool], list[AnswerScore]] = {}
    for score in scores:
        groups.setdefault((score.question.kind or "unlabelled", bool(score.question.relevant)), []).append(score)
    report = {}
    for (kind, answerable), group in sorted(groups.items()):
        name = kind if (kind, not answerable) not in groups else f"{kind} ({'answerable' if answerable else 'unanswerable'})"
        report[name] = _answerable_side(group) if answerable else _unanswerable_side(group)
    return report


def summarise_answers(scores: Sequence[AnswerScore]) -> dict[str, object]:
    """Offline scoring of answers against the eval file's expected facts and documents:
    - answered: share of answerable questions that got an answer (not an abstention, not "uncertain");
    - fact_recall: share of the expected facts found in the answer text, over all answerable questions;
    - right_document: share of answerable questions whose answer cites a relevant document;
    - no_unrelated_source: share of answered questions that cite no document outside `relevant`;
    - wrongly_declined: answerable questions that were declined (count);
    - near_miss_declined / off_topic_declined: share of unanswerable questions of that kind that were declined;
    - abstention_accuracy: share of unanswerable questions declined;
    - balanced_score: see `balanced_score`;
    - quote_length: mean characters quoted per reply that quoted anything (`quoted_characters`), so quoting a
      whole table cannot pass as recall;
    - answerable / unanswerable: the outcome shares (answered, uncertain, declined) on each side, with the side's
      own metrics and its mean credit; by_category: the same per category."""
    answerable = [s for s in scores if s.question.relevant]
    unanswerable = [s for s in scores if not s.question.relevant]
    answered = [s for s in answerable if s.result == "answer"]
    facts_total = sum(len(s.question.facts) for s in answerable)

    def declined(kind: str) -> float:
        of_kind = [s for s in unanswerable if s.question.kind == kind]
        return _share(sum(s.result == "decline" for s in of_kind), len(of_kind))

    return {
        "answerable": len(answerable),
        "answered": _share(len(answered), len(answerable)),
        "fact_recall": _share(sum(s.facts_found for s in answerable), facts_total),
        "right_document": _share(sum(s.right_document for s in answerable), len(answerable)),
        "no_unrelated_source": _share(sum(s.unrelated_sources == 0 for s in answered), len(answered)),
        "wrongly_declined": sum(s.result == "decline" for s in answerable),
        "near_miss_declined": declined("near_miss"),
        "off_topic_declined": declined("off_topic"),
        "abstention_accuracy": _abstention_accuracy(scores),
        "balanced_score": balanced_score(scores),
        "quote_length": quote_length(scores),
        **_judged_metrics(answered),
        "by_side": {"answerable": _answerable_side(answerable), "unanswerable": _unanswerable_side(unanswerable)},
        "by_category": summarise_by_category(scores),
    }


def _abstention_accuracy(scores: Sequence[AnswerScore]) -> float:
    """Share of unanswerable questions (no `relevant` documents) that the bot declined to answer."""
    unanswerable = [s for s in scores if not s.question.relevant]
    return _share(sum(s.result == "decline" for s in unanswerable), len(unanswerable))


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
    kb: KnowledgeBase, questions: Sequence[EvalQuestion], principals: Sequence[str], sources: Sequence[str] | None = None,
    judge: AnswerJudge | None = None, strategy: str = "memory",
) -> tuple[dict[str, object], list[AnswerScore]]:
    """Ask every question through the full answer pipeline (offline unless an API key is set) and score it; with a
    judge, every answered answerable question is also graded for faithfulness and relevance. For each answerable
    question the hybrid search of what the answer searched is also ranked (same principals and sources), so the
    answer can be held to what retrieval gave it (`right_document_when_retrieved_first`)."""
    filters = SearchFilters(tuple(principals), tuple(sources) if sources else None)
    scores = []
    run = uuid.uuid4().hex[:12]
    for number, question in enumerate(questions):
        # Each question is its own conversation, new in every run: with one shared id, every question was read as
        # a follow-up of the ones before it (of earlier runs too), and answers depended on what ran before.
        # The baselines (`strategy`, as in search_queries) answer without the conversation: the last question, or
        # the last two user turns as one question.
        asked = last_two_user_turns(question) if strategy == "last-two" else question.question
        prior = list(question.history) if strategy == "memory" else []
        answer = await kb.answer(asked, principals, f"eval:answers:{run}:{number}", sources=sources,
                                 prior_messages=prior or None)
        score = score_answer(question, answer)
        if question.relevant:
            found = await kb.search(answer.standalone_query or question.question, filters, k=10, mode="hybrid",
                                    max_per_document=1)
            score = replace(score, retrieved_first=bool(found.hits) and found.hits[0].external_id in question.relevant)
        if judge is not None and question.relevant and score.result == "answer":
            passages = [f"{hit.title}: {hit.text}" for hit in answer.chunks_used]
            try:
                score = replace(score, judgement=await judge.judge(question.question, passages, answer.text))
            except JudgeError as exc:
                score = replace(score, judge_error=str(exc))
        scores.append(score)
    return summarise_answers(scores), scores
