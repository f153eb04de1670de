"""Decline means off-topic (issue 39, the last gap). A question worded differently from its document ("caught a
nasty cold and can't make it in" for "ill and unable to work") shares almost no word with it, so the fitted
"related" model, which leans on shared words, read it as off-topic and declined it. A decline now also needs every
retrieved chunk to be further from the question than the dense floor fitted on SQuAD 2.0 (`Calibration.dense_floor`):
the embedding carries the synonym. A question about something the documents do not cover at all is still declined."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

from conftest import write

from knowledge import KnowledgeBase
from knowledge.answer.evidence import Calibration, Evidence, decide
from knowledge.sources.folder import FolderSource

EVERYONE = ["everyone"]

DOCS = {
    "finance/travel.md": """# Business travel

## Getting there

Rail fares are reimbursable in standard class when the journey is booked through the travel desk. Keep the receipt
and submit it with your expense report within 30 days.
""",
    "people/sick-leave.md": """# Sick leave

## Reporting an absence

If you are ill and unable to work, tell your manager before your working day starts. From the fourth day of illness
a doctor's note is required.
""",
    "office/canteen.md": """# Canteen

## Opening hours

The canteen serves lunch from 11:30 to 14:00 on working days.
""",
    "office/badges.md": """# Building access

## Lost badges

A lost badge is blocked at the reception desk, which issues a temporary badge for the day.
""",
}

# No content word of the question is in any document; its meaning is the sick-leave page's.
SYNONYM = "I've caught a nasty cold and can't make it in. What should I do?"
OFF_TOPIC = "Who won the football World Cup in 1998?"


async def test_a_question_in_other_words_is_not_declined_while_an_off_topic_one_is(
        fresh_kb: KnowledgeBase, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    for name, text in DOCS.items():
        write(docs, name, text)
    assert not (await fresh_kb.sync(FolderSource(docs))).failed
    answer = await fresh_kb.answer(SYNONYM, EVERYONE, f"synonyms:{uuid.uuid4().hex[:8]}")
    assert answer.outcome in ("answer", "uncertain"), answer.evidence
    assert answer.citations and answer.citations[0].external_id == "people/sick-leave.md"
    assert "tell your manager before your working day starts" in answer.text
    # It shares no content word with the sentence that answers: only the embedding tells it is on topic.
    assert answer.evidence is not None and answer.evidence.unit_coverage < 0.5, answer.evidence

    off = await fresh_kb.answer(OFF_TOPIC, EVERYONE, f"synonyms:{uuid.uuid4().hex[:8]}")
    assert off.outcome == "decline" and off.abstained and off.citations == []
    # Both came from the shipped decision, fitted on SQuAD 2.0, floor included (no constant chosen here).
    shipped = Calibration.load()
    assert shipped.dense_floor is not None and "SQuAD" in shipped.fitted_on
    assert off.evidence is not None and off.evidence.dense < shipped.dense_floor <= answer.evidence.dense


def test_a_decline_needs_both_the_related_model_and_the_dense_floor() -> None:
    # A hand-made related model that only reads coverage: a synonym has none, an on-topic question a lot.
    hand = Calibration(weights={"coverage": 1.0}, bias=0.0, mean={"coverage": 0.5}, scale={"coverage": 0.25},
                       answer_at=0.9, decline_below=0.1, related_weights={"coverage": 4.0}, related_bias=0.0)
    synonym = Evidence(dense=0.45, support=0.45, coverage=0.0, margin=0.3, agreement=2)
    elsewhere = Evidence(dense=0.12, support=0.15, coverage=0.0, margin=0.1, agreement=1)
    assert decide(synonym, hand) == "decline" and decide(elsewhere, hand) == "decline"  # no floor: as fitted before
    floored = replace(hand, dense_floor=0.3)
    assert decide(synonym, floored) == "uncertain" and decide(elsewhere, floored) == "decline"
    assert Calibration.from_dict(floored.to_dict()).dense_floor == 0.3
