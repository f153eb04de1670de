"""Offline answers on small generated knowledge bases (issue 39): the whole unit that answers (a procedure's steps,
an FAQ's answer, one CSV row with its header, a definition's sentence), the current version of a policy before an
older one (with a note, both cited), and a near miss naming an office the documents do not hold."""

from __future__ import annotations

import uuid

import pytest
from conftest import write

from knowledge.answer.generators.extractive import HEDGE_NOTE, Passage, currency
from knowledge.sources.folder import FolderSource

EVERYONE = ["everyone"]

PASSWORD = """# Accounts

## How do I reset my password?

Open the self-service portal and choose Forgot password. A reset takes about five minutes.

1. Enter your work email address.
2. Type the six-digit code sent to your phone.
3. Choose a new password of at least fourteen characters.
4. Sign in again on every device you use.

## Who can see my account details?

Only IT administrators can see account details, and every look is logged.
"""

FAQ = """# Expenses FAQ

Q: Can I expense a taxi to the airport?

Yes. Taxis to and from the airport are reimbursed when you travel on company business; keep the receipt.

Q: Is a lunch with a client reimbursed?

Client lunches are reimbursed up to 60 EUR per person, with the names of the guests on the claim.
"""

PARTS = "part_number,description,unit_price,warehouse\n" + "".join(
    f"PX-{1030 + i},{name} assembly,{10 + 3 * i}.50 EUR,{'Leipzig' if i % 2 else 'Lyon'}\n"
    for i, name in enumerate(["Hinge", "Valve", "Bracket", "Spring", "Gasket", "Pulley", "Rotor", "Clamp", "Flange",
                              "Bushing", "Sprocket", "Coupling", "Damper", "Lever", "Nozzle", "Piston", "Shaft",
                              "Sensor", "Washer", "Spindle"])
)

GLOSSARY = """# Glossary

## Terms

A purchase order is a document the buyer sends to a supplier to order goods at agreed prices. Purchase orders
are numbered by the finance system. Every purchase order over 5,000 EUR needs a second approval.
"""

TRAVEL_2025 = """# Travel policy 2025

## Meals

The daily meal allowance for business trips is EUR 64 per day.
"""

TRAVEL_2026 = """# Travel policy 2026

## Meals

The daily meal allowance for business trips is EUR 70 per day. This policy supersedes the 2025 travel policy.
"""

MEETING = """# Finance committee meeting notes 2026

## Proposals

A member proposed that the daily meal allowance for business trips be raised to EUR 80 per day.
"""

OFFICES = """# Office opening hours

## Munich office

The Munich office is open Monday to Friday from 8:00 to 18:00; the reception closes at 17:30.

## Shenzhen office

The Shenzhen office is open Monday to Saturday from 9:00 to 19:00; visitors sign in at the front desk.
"""


@pytest.fixture
async def units_kb(fresh_kb, tmp_path):
    docs = tmp_path / "docs"
    for name, text in {"it/password.md": PASSWORD, "finance/expenses-faq.md": FAQ, "ops/parts.csv": PARTS,
                       "finance/glossary.md": GLOSSARY, "travel/policy-2025.md": TRAVEL_2025,
                       "travel/policy-2026.md": TRAVEL_2026, "finance/meeting-notes.md": MEETING,
                       "facilities/offices.md": OFFICES}.items():
        write(docs, name, text)
    report = await fresh_kb.sync(FolderSource(docs))
    assert not report.failed
    return fresh_kb


async def ask(kb, question: str):
    return await kb.answer(question, EVERYONE, f"units:{uuid.uuid4().hex[:8]}")


async def test_a_how_do_i_question_quotes_every_step_under_its_heading(units_kb):
    answer = await ask(units_kb, "How do I reset my password?")
    assert answer.outcome != "decline" and answer.citations[0].external_id == "it/password.md"
    for step in ("Enter your work email address.", "Type the six-digit code sent to your phone.",
                 "Choose a new password of at least fourteen characters.", "Sign in again on every device you use."):
        assert step in answer.text
    assert "IT administrators" not in answer.text  # the next heading's section is not a step


async def test_an_faq_question_quotes_the_answer_under_it_not_the_question(units_kb):
    answer = await ask(units_kb, "Can I expense a taxi to the airport?")
    assert answer.outcome != "decline" and answer.citations[0].external_id == "finance/expenses-faq.md"
    assert "Taxis to and from the airport are reimbursed" in answer.text
    assert "Q: Can I expense a taxi" not in answer.text
    assert "60 EUR" not in answer.text  # the next question's answer


async def test_a_question_about_one_part_quotes_its_row_with_the_header_not_the_table(units_kb):
    answer = await ask(units_kb, "What is the unit price of part PX-1042?")
    assert answer.outcome != "decline" and answer.citations[0].external_id == "ops/parts.csv"
    assert "| part_number | description | unit_price | warehouse |" in answer.text
    assert "| PX-1042 | Damper assembly | 46.50 EUR | Lyon |" in answer.text
    rows = [line for line in answer.text.splitlines() if line.startswith("| PX-")]
    assert len(rows) <= 3, answer.text


async def test_a_definition_question_quotes_the_sentence_that_defines(units_kb):
    answer = await ask(units_kb, "What is a purchase order?")
    assert answer.outcome != "decline" and answer.citations[0].external_id == "finance/glossary.md"
    assert "A purchase order is a document the buyer sends to a supplier" in answer.text
    assert "second approval" not in answer.text


async def test_the_current_policy_is_quoted_first_and_the_older_one_is_noted(units_kb):
    answer = await ask(units_kb, "What is the daily meal allowance for business trips?")
    assert answer.outcome != "decline"
    assert answer.citations[0].external_id == "travel/policy-2026.md"
    text = answer.text
    # The older policy is quoted after the current one, under a note naming both, and cited.
    assert "EUR 70" in text and "EUR 64" in text and text.index("EUR 70") < text.index("EUR 64")
    note = "Travel policy 2025 [2] states this differently; Travel policy 2026 [1], quoted first, is the current version"
    assert note in text and text.index(note) < text.index("EUR 64")
    assert [c.external_id for c in answer.citations][:2] == ["travel/policy-2026.md", "travel/policy-2025.md"]
    # The meeting's proposal never comes before the settled figure.
    assert "EUR 80" not in text or text.index("EUR 70") < text.index("EUR 80")


async def test_a_question_naming_an_absent_office_is_uncertain_and_says_what_was_not_found(units_kb):
    answer = await ask(units_kb, "What are the opening hours of the Tokyo office?")
    assert answer.outcome == "uncertain", answer.text
    assert answer.text.startswith(HEDGE_NOTE)
    assert "Not found in these documents: “Tokyo”" in answer.text
    assert answer.evidence is not None and answer.evidence.not_found == ("Tokyo",)
    # The same question about an office the documents hold names nothing missing.
    munich = await ask(units_kb, "What are the opening hours of the Munich office?")
    assert munich.evidence is not None and munich.evidence.not_found == ()
    assert "Not found" not in munich.text and "8:00 to 18:00" in munich.text


def test_a_replacing_document_and_a_settled_policy_outrank_older_versions_and_meeting_notes():
    policy = Passage(1, "Travel policy", "Meals", 0, "The daily meal allowance is EUR 70.")
    notes = Passage(2, "Finance committee meeting notes 2026", "Proposals", 0, "A member proposed EUR 80.")
    old, new = (Passage(n, f"Travel policy {year}", "Meals", 0, "The allowance is EUR 64.") for n, year in
                ((3, 2025), (4, 2026)))
    effective = Passage(5, "Travel policy", "Meals", 0, "Effective 1 January 2027, the allowance is EUR 72.")
    replacing = Passage(6, "Travel rules", "", 0, "These rules replace the travel policy; the allowance is EUR 75.")
    assert currency([policy]) > currency([notes])  # notes of a meeting never outrank the policy, whatever the year
    assert currency([new]) > currency([old])  # the year in the title
    assert currency([effective]) > currency([new])  # an effective date in the text
    assert currency([replacing]) > currency([effective])  # "replaces" wins
