"""`ragbot eval FILE --answers` with an LLM: faithfulness, answer relevance and context relevance graded by a judge
(Claude through the fake Anthropic API, with scripted judge replies), and abstention accuracy."""

import json

from fakes.anthropic_api import RecordedRequest
from test_answer_llm import CORPUS, fake_anthropic, open_kb  # noqa: F401  (fixture)

from knowledge.eval.evaluation import EvalQuestion, evaluate_answers
from knowledge.eval.judging import JUDGE_SYSTEM, AnswerJudge, parse_judgement

QUESTIONS = [
    EvalQuestion("q1", "How many vacation days do full-time employees get?", {"policies/vacation.md": 1},
                 facts=("25 days",)),
    EvalQuestion("q2", "How do I set up the VPN?", {"it/vpn.md": 1}, facts=("WireGuard",)),
    EvalQuestion("q3", "What was the score of last night's football match in Madrid?", {}, kind="off_topic"),
]

VACATION_GRADE = {
    "claims": [{"claim": "Full-time employees get 25 vacation days.", "supported": True},
               {"claim": "Unused days are paid out in cash.", "supported": False}],
    "answer_relevance": 0.9,
    "relevant_passages": [1],
}


def scripted(request: RecordedRequest) -> str:
    """The answer model and the judge share the fake API; the judge is told apart by its system prompt."""
    if request.system_text == JUDGE_SYSTEM:
        if "vacation" in request.user_text.split("<passages>")[0]:
            return "Here is my grading:\n" + json.dumps(VACATION_GRADE)
        return "The answer looks fine to me."  # not the JSON asked for: counted as unjudged
    if "football" in request.user_text.split("</sources>")[-1]:
        return "NO_ANSWER"  # the model declines: nothing in the sources answers it
    if "set up the VPN" in request.user_text.split("</sources>")[-1]:
        return "Install the WireGuard client and import the configuration from the IT portal [1]."
    return "Full-time employees get 25 days of paid vacation [1]. Unused days are paid out in cash [1]."


async def test_llm_answer_metrics_from_scripted_judge_replies(kb_factory, fake_anthropic, tmp_path):  # noqa: F811
    kb = await open_kb(kb_factory, fake_anthropic, tmp_path, CORPUS)
    fake_anthropic.default = scripted
    judge = AnswerJudge(kb.settings)
    try:
        summary, scores = await evaluate_answers(kb, QUESTIONS, ["everyone"], judge=judge)
    finally:
        await judge.close()

    # One claim of two is supported; relevance as graded; the passage numbered 1 of those sent was relevant.
    vacation = scores[0].judgement
    assert vacation is not None and (vacation.claims, vacation.supported) == (2, 1)
    assert summary["faithfulness"] == 0.5
    assert summary["answer_relevance"] == 0.9
    assert summary["context_relevance"] == round(1 / vacation.passages, 4)
    assert (summary["judged"], summary["unjudged"]) == (1, 1)
    assert scores[1].judge_error and "no JSON" in scores[1].judge_error
    # The off-topic question was declined (by the retrieval threshold or by the model), and never judged.
    assert scores[2].abstained and summary["abstention_accuracy"] == 1.0
    assert summary["fact_recall"] == 1.0

    judge_requests = [r for r in fake_anthropic.requests if r.system_text == JUDGE_SYSTEM]
    assert len(judge_requests) == 2
    first = judge_requests[0]
    assert "25 days of paid vacation per year" in first.user_text  # the context the answer was built from
    assert "paid out in cash" in first.user_text.split("<answer>")[1]  # the answer being graded


def test_judge_replies_are_data_not_scores_by_default():
    grade = parse_judgement('{"claims": [], "answer_relevance": 1, "relevant_passages": [1, 2, 9]}', passages=3)
    assert grade.faithfulness == 1.0  # an answer that claims nothing invents nothing
    assert grade.context_relevance == 2 / 3  # passage 9 was never sent
    for bad in ('{"claims": "all", "answer_relevance": 2}', '{"answer_relevance": 0.5}', "no json"):
        try:
            parse_judgement(bad, passages=2)
        except Exception as exc:  # noqa: BLE001
            assert type(exc).__name__ == "JudgeError"
        else:
            raise AssertionError(f"accepted {bad!r}")
