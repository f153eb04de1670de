"""Answer, uncertain or decline, and quoting the unit that answers (issue 31), offline on the example handbook."""

from __future__ import annotations

import uuid

import pytest

from knowledge.answer.evidence import FEATURES, Calibration, Evidence, decide
from knowledge.answer.generators.extractive import HEDGE_NOTE, Passage, ScoredUnit, compose
from knowledge.answer.generators.passages import units_of

EVERYONE = ["everyone"]


async def ask(kb, question: str):
    return await kb.answer(question, EVERYONE, f"outcomes:{uuid.uuid4().hex[:8]}")


async def test_a_question_about_a_table_quotes_the_whole_small_table_with_its_header(handbook_kb):
    answer = await ask(handbook_kb, "How many PTO days?")
    assert answer.outcome != "decline" and answer.citations[0].external_id == "policies/leave.md"
    assert "| Years of service | Annual PTO | Accrual per pay period |" in answer.text
    for row in ("0–2 years (including your first year) | 15 days", "3–5 years | 20 days", "6+ years | 25 days"):
        assert row in answer.text


async def test_a_question_naming_one_row_quotes_that_row_with_its_header(handbook_kb):
    # Issue 39: a question about one row quotes that row with its header, not the table (issue 31 quoted the whole
    # small table, the standard cardholder's row included).
    answer = await ask(handbook_kb, "What are the spending limits on a corporate card for managers?")
    assert "| Managers and department heads | $10,000 | $5,000 |" in answer.text
    assert "| Standard cardholder | $5,000 | $2,500 |" not in answer.text
    assert answer.citations[0].external_id == "finance/corporate-card.docx"


def test_a_list_answer_keeps_its_lead_in_once_and_every_item():
    text = ("Northwind matches your contributions every paycheck:\n\n- **100%** of the first **4%** of eligible pay\n"
            "- **50%** of the next **2%**.\n\nBoth Traditional and Roth contributions are matched.")
    passage = Passage(1, "401(k) Retirement Plan", "Company match", 4, text)
    units = units_of(text, 4)
    # the lead-in sentence scores best: it brings its list; the list's second item alone would bring the first
    for best in (units[0], units[2]):
        scored = [ScoredUnit(1, passage, best, 0.7, 1.0)] + [
            ScoredUnit(1, passage, u, 0.1, 0.1) for u in units if u is not best]
        answer = compose("What is the company match?", [passage], None, scored=scored)  # type: ignore[arg-type]
        assert answer is not None
        assert answer.text.count("Northwind matches your contributions every paycheck:") == 1
        assert "**100%** of the first **4%**" in answer.text and "**50%** of the next **2%**" in answer.text


async def test_pet_insurance_is_not_answered_from_life_insurance(handbook_kb):
    answer = await ask(handbook_kb, "Does Northwind offer pet insurance for dogs and cats?")
    assert answer.outcome in ("uncertain", "decline")
    if answer.outcome == "uncertain":
        assert answer.text.startswith(HEDGE_NOTE) and not answer.abstained and answer.citations
        assert answer.to_dict()["outcome"] == "uncertain"


async def test_an_off_topic_question_is_declined_with_related_documents(handbook_kb):
    answer = await ask(handbook_kb, "What's the population of Japan?")
    assert answer.outcome == "decline" and answer.abstained and answer.citations == []
    payload = answer.to_dict()
    assert payload["outcome"] == "decline" and payload["abstained"] is True and "related" in payload


async def test_a_paraphrase_retrieval_is_sure_of_is_not_declined(handbook_kb):
    answer = await ask(handbook_kb, "Does Northwind put extra cash into my pension pot?")
    assert answer.outcome != "decline"
    assert answer.citations[0].external_id == "benefits/401k.md"


# A hand-made decision, to pin how `decide` reads a model: probability from standardised features, two cut points,
# and the specific-words rule beside it.
HAND = Calibration(weights={"support": 4.0, "coverage": 2.0}, bias=0.0, mean={"support": 0.5, "coverage": 0.5},
                   scale={"support": 0.1, "coverage": 0.25}, answer_at=0.7, decline_below=0.1)


@pytest.mark.parametrize("evidence, expected", [
    (Evidence(dense=0.12, support=0.15, coverage=0.0, margin=0.2, agreement=1), "decline"),
    (Evidence(dense=0.70, support=0.75, coverage=0.9, margin=0.5, agreement=2), "answer"),
    (Evidence(dense=0.50, support=0.50, coverage=0.5, margin=0.01, agreement=1), "uncertain"),
    # a close passage whose document lacks the office the question names: uncertain at best
    (Evidence(dense=0.70, support=0.75, coverage=0.9, margin=0.5, agreement=2, not_found=("Tokyo",)), "uncertain"),
])
def test_the_outcome_reads_the_fitted_model(evidence, expected):
    assert decide(evidence, HAND) == expected


def test_the_shipped_decision_was_fitted_on_squad_and_meets_the_targets_on_held_out_articles():
    shipped = Calibration.load()
    assert set(shipped.weights) == set(FEATURES) and "SQuAD" in shipped.fitted_on
    held_out = shipped.report["held_out"]
    assert isinstance(held_out, dict)
    assert held_out["unanswerable"]["answered"] <= 0.20 and held_out["answerable"]["declined"] <= 0.05
    # A clear answer is answered, nothing related is declined, with the fitted model.
    assert decide(Evidence(0.8, 0.85, 1.0, 0.6, 2, 1.0, 0.0), shipped) == "answer"
    assert decide(Evidence(0.05, 0.08, 0.0, 0.0, 0, 0.0, 1.0), shipped) == "decline"


def test_a_calibration_file_that_is_not_one_is_refused_with_the_fix(tmp_path):
    bad = tmp_path / "calibration.json"
    bad.write_text('{"weights": {"shoe_size": 1.0}}')
    with pytest.raises(ValueError, match="not a calibration file written by `make calibrate`.*unset ANSWER_CALIBRATION"):
        Calibration.load(bad)
