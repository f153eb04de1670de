"""The question's own terms, as the answer's evidence counts them (issue 39, what was still short): the ending of a
contraction ("I've", "can't"), the compound Postgres makes of a hyphenated word ("write-up") and a Chinese bigram
that spans two words are not terms a document could hold, so they must not read as rare terms the answer lacks."""

from __future__ import annotations

import uuid

from conftest import write

from knowledge.answer.generators.extractive import content_text
from knowledge.sources.folder import FolderSource
from knowledge.storage.words import lexical_text, word_text

EVERYONE = ["everyone"]

INCIDENTS = """# Incident reviews

## After an outage

After every outage that customers noticed, the on-call engineer must write up what happened within five business
days.
"""

LUNCH = """# Canteen

## Opening hours

The canteen serves lunch from 11:30 to 14:00 on working days.
"""

BADGES = """# Building access

## Lost badges

A lost badge is blocked at the reception desk, which issues a temporary badge for the day.
"""


def test_contraction_endings_and_hyphenated_compounds_are_not_question_terms():
    text = content_text("I've lost it and can't find it; doesn't the write-up say what we'll do?")
    words = text.split()
    assert "ve" not in words and "t" not in words and "ll" not in words and "doesn" not in words
    assert "write-up" not in text and ["write", "up"] == words[words.index("write"):words.index("write") + 2]
    assert "lost" in words and "find" in words
    assert content_text("Who owns the SEV-1 review?").split() == ["owns", "SEV-1", "review?"]  # a code keeps its hyphen


def test_a_chinese_question_counts_its_words_not_the_bigrams_across_them():
    question = "没用完的年假可以结转几天？"
    assert "用完" in lexical_text(question).split()  # the index's bigrams span words ("没用|完")...
    assert "用完" not in word_text(question).split() and "结转" in word_text(question).split()  # ...its terms do not
    assert word_text("Carry over unused days.") == "Carry over unused days."


async def test_a_question_with_contractions_and_a_hyphenated_word_lacks_no_term_of_the_sentence_that_answers(
        fresh_kb, tmp_path):
    docs = tmp_path / "docs"
    for name, text in {"ops/incidents.md": INCIDENTS, "office/canteen.md": LUNCH, "office/badges.md": BADGES}.items():
        write(docs, name, text)
    assert not (await fresh_kb.sync(FolderSource(docs))).failed
    answer = await fresh_kb.answer("We've had an outage that customers noticed. Who's doing the write-up?",
                                   EVERYONE, f"terms:{uuid.uuid4().hex[:8]}")
    assert answer.evidence is not None
    # Every term of the question is in the sentence quoted: nothing rare is missing ("ve", "s", "write-up" were).
    assert answer.evidence.unit_missing_rare == 0.0 and answer.evidence.unit_coverage == 1.0, answer.evidence
    assert answer.outcome != "decline" and "must write up what happened" in answer.text
    assert answer.citations[0].external_id == "ops/incidents.md"
