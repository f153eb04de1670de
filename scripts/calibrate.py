"""`make calibrate`: fit the answer / `uncertain` / decline decision on SQuAD 2.0 and report it on held-out articles.

    .venv/bin/python scripts/calibrate.py [--data ../shared/data/squad2-calibration] [--refresh] [--no-answers]

1. Indexes the calibration corpus (320 paragraphs) as an eval-only source in its own home
   (RAGBOT_HOME, default .ragbot/calibration: BM25's statistics are the corpus's alone).
2. Computes every question's evidence exactly as an answer does (`Answerer.evidence_for`), asked of the whole corpus
   and again with its own article left out (each article is shared with a group of its own: an off-topic question
   for the "related at all" model), and caches it (.ragbot/calibration/features.jsonl, off_topic.jsonl; embeddings
   in embeddings.pkl), so refitting costs no embedding.
3. Fits the decision on the questions of FIT_ARTICLES (knowledge/eval/calibration.py) and writes it, with its report,
   to knowledge/answer/calibration.json.
4. Unless --no-answers: answers every question of HELD_OUT_ARTICLES through the whole offline pipeline with the
   fitted decision and adds the `ragbot eval --answers` figures to the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("RAGBOT_HOME", str(REPO / ".ragbot" / "calibration"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from knowledge import KnowledgeBase  # noqa: E402  (RAGBOT_HOME must be set first)
from knowledge.answer.evidence import DEFAULT_CALIBRATION  # noqa: E402
from knowledge.eval.calibration import (  # noqa: E402
    ARTICLES,
    FIT_ARTICLES,
    HELD_OUT_ARTICLES,
    MAX_ANSWERABLE_DECLINED,
    MAX_UNANSWERABLE_ANSWERED,
    Example,
    article_of,
    auc,
    decisions,
    fit,
)
from knowledge.eval.evaluation import evaluate_answers, load_corpus, load_jsonl_questions  # noqa: E402
from knowledge.settings import KnowledgeSettings  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad2-calibration"


_EMBEDDINGS: dict[str, list[float]] = {}
_EMBEDDINGS_FILE: list[Path] = []


def cache_embeddings(kb: KnowledgeBase, path: Path) -> None:
    """Memoise the embedder on disk: the same paragraphs' sentences are scored for many questions."""
    embedder = kb.answerer.embedder
    cache = _EMBEDDINGS
    cache.update(pickle.loads(path.read_bytes()) if path.exists() else {})
    _EMBEDDINGS_FILE.append(path)
    original = embedder.embed

    def embed(texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in cache]
        if missing:
            for text, vector in zip(missing, original(missing), strict=True):
                cache[text] = vector
        return [cache[t] for t in texts]

    embedder.embed = embed  # type: ignore[method-assign]  # mypy: an instance-level memo over the real model


def save_embeddings(kb: KnowledgeBase) -> None:
    for path in _EMBEDDINGS_FILE:
        path.write_bytes(pickle.dumps(_EMBEDDINGS))


def group_of(article: str) -> str:
    """Each article is shared with its own group: a question can then be asked with its article left out."""
    return f"group:ragbot-eval-squad-{article}"


ALL_GROUPS = [group_of(a) for a in ARTICLES]


def code_version() -> str:
    """The commit the figures were measured on (with "+changes" when the worktree differs from it), for the report."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "knowledge", "scripts",
                  ":(exclude)knowledge/answer/calibration.json")  # the fit's own output
    return commit + ("+changes" if changed else "")


async def extract(kb: KnowledgeBase, records: list[dict[str, Any]], sources: list[str], path: Path, *,
                  off_topic: bool = False) -> list[dict[str, Any]]:
    """Every question's evidence, asked of the whole corpus, or (`off_topic`) of every article but its own."""
    rows = []
    started = time.perf_counter()
    for number, record in enumerate(records):
        article = article_of(record)
        principals = [g for g in ALL_GROUPS if g != group_of(article)] if off_topic else ALL_GROUPS
        evidence, hits = await kb.answerer.evidence_for(record["question"], principals, sources)
        rows.append({
            "id": record["id"], "article": article, "answerable": bool(record["relevant"]), "off_topic": off_topic,
            "features": evidence.features() if evidence else None,
            "not_found": list(evidence.not_found) if evidence else [],
            "top": hits[0].external_id if hits else None,
            "relevant_first": bool(hits) and hits[0].external_id in record["relevant"],
        })
        if number % 200 == 199:
            print(f"  {number + 1}/{len(records)} questions, {time.perf_counter() - started:.0f} s", file=sys.stderr)
            save_embeddings(kb)
    save_embeddings(kb)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def examples_of(rows: list[dict[str, Any]], articles: Sequence[str]) -> tuple[list[Example], list[bool]]:
    chosen = [r for r in rows if r["article"] in articles and r["features"] is not None]
    return ([Example(r["article"], r["answerable"], r["features"], r.get("off_topic", False)) for r in chosen],
            [bool(r["not_found"]) for r in chosen])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the squad2-calibration folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_CALIBRATION)
    parser.add_argument("--refresh", action="store_true", help="recompute the cached evidence")
    parser.add_argument("--no-answers", action="store_true", help="skip answering the held-out questions")
    args = parser.parse_args()
    if not (args.data / "questions.jsonl").exists():
        sys.exit(f"error: {args.data}/questions.jsonl not found: pass --data with the squad2-calibration folder")
    work = Path(os.environ["RAGBOT_HOME"])
    work.mkdir(parents=True, exist_ok=True)
    records = [json.loads(line) for line in (args.data / "questions.jsonl").read_text().splitlines() if line.strip()]
    kb = await KnowledgeBase.open(KnowledgeSettings(answer_calibration=args.out if args.out.exists() else None))
    try:
        await kb.ensure_embedding_space()
        corpus = load_corpus(args.data / "corpus.jsonl")
        source = replace(corpus, item_list=[replace(item, access=(group_of(item.external_id.split("#", 1)[0]),))
                                            for item in corpus.item_list])
        report = await kb.sync(source)
        print(f"{source.spec.name}: {len(report.added) + len(report.updated)} indexed, {report.unchanged} cached",
              file=sys.stderr)
        sources = [source.spec.name]
        cache_embeddings(kb, work / "embeddings.pkl")
        rows = []
        for name, off_topic in (("features.jsonl", False), ("off_topic.jsonl", True)):
            cached = work / name
            if cached.exists() and not args.refresh:
                rows += [json.loads(line) for line in cached.read_text().splitlines() if line.strip()]
            else:
                rows += await extract(kb, records, sources, cached, off_topic=off_topic)

        fit_set, fit_flags = examples_of(rows, FIT_ARTICLES)
        held_out, held_flags = examples_of(rows, HELD_OUT_ARTICLES)
        model = fit([e for e in fit_set if not e.off_topic], [e for e in fit_set if e.off_topic],
                    fitted_on="SQuAD 2.0 articles " + ", ".join(FIT_ARTICLES))
        report_data: dict[str, object] = {
            "code": code_version(),
            "data": "SQuAD 2.0 dev (CC BY-SA 4.0), 8 articles as split by CS224n: ../shared/data/squad2-calibration",
            "split": {"fit": list(FIT_ARTICLES), "held_out": list(HELD_OUT_ARTICLES),
                      "how": "articles in alphabetical order, alternately; fixed before fitting"},
            "targets_on_fit": {"max_unanswerable_answered": MAX_UNANSWERABLE_ANSWERED,
                               "max_answerable_declined": MAX_ANSWERABLE_DECLINED},
            "fit": {"auc": auc(model, fit_set), **decisions(model, fit_set, fit_flags)},
            "held_out": {"auc": auc(model, held_out), **decisions(model, held_out, held_flags)},
        }
        print(json.dumps(report_data, indent=2))
        model = replace(model, report=report_data)
        args.out.write_text(json.dumps(model.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
        if not args.no_answers:
            kb.answerer.settings = replace(kb.answerer.settings, calibration=model)
            questions = load_jsonl_questions(args.data / "questions.jsonl")
            by_id = dict(zip((q.id for q in questions), records, strict=True))
            chosen = [q for q in questions if article_of(by_id[q.id]) in HELD_OUT_ARTICLES]
            started = time.perf_counter()
            summary, _ = await evaluate_answers(kb, chosen, ALL_GROUPS, sources)
            save_embeddings(kb)
            print(f"answered {len(chosen)} held-out questions in {time.perf_counter() - started:.0f} s",
                  file=sys.stderr)
            answers: dict[str, object] = {k: summary[k] for k in ("by_side", "by_category", "quote_length") if k in summary}
            report_data["held_out_answers"] = {
                "code": report_data["code"],
                "command": "make calibrate (scripts/calibrate.py): the held-out articles' questions through "
                           "KnowledgeBase.answer, offline, scored as `ragbot eval --answers` scores them",
                **answers,
            }
            print(json.dumps(report_data["held_out_answers"], indent=2))
            args.out.write_text(json.dumps(replace(model, report=report_data).to_dict(), indent=2) + "\n",
                                encoding="utf-8")
    finally:
        await kb.close()


if __name__ == "__main__":
    asyncio.run(main())
