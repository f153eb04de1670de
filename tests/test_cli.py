"""The `ragbot` command line, as a user (and the tools that parse its --json output) sees it.

Most tests run the Typer app in-process with CliRunner so the embedding model loads once (and documents parse in
a thread: conftest.IN_PROCESS_CLI_ENV); one test runs the installed console script to prove the entry point works.
Each command reads DATABASE_URL when it runs, so a test points the CLI at its database with monkeypatch.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import IN_PROCESS_CLI_ENV, write
from typer.testing import CliRunner

from bot.cli import app

REPO = Path(__file__).resolve().parent.parent
RAGBOT = REPO / ".venv" / "bin" / "ragbot"
METRIC_KEYS = {"ndcg@10", "recall@100", "mrr@10", "map@100", "precision@5", "recall@10"}
SEARCH_DOCUMENT_KEYS = {"id", "external_id", "title", "url", "path", "source"}
SEARCH_CHUNK_KEYS = {"id", "text", "heading"}
CITATION_KEYS = {"n", "title", "url", "path", "external_id", "heading", "quotes"}

runner = CliRunner(env=IN_PROCESS_CLI_ENV)  # commands parse in a thread, as the tests' own KBs do


def cli(*args: str, input: str | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args), input=input, catch_exceptions=False)


def ok(*args: str, input: str | None = None):  # type: ignore[no-untyped-def]
    result = cli(*args, input=input)
    assert result.exit_code == 0, f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def text(result) -> str:  # type: ignore[no-untyped-def]
    """Human output with rich's line wrapping undone (the CliRunner's terminal is 80 columns wide)."""
    return " ".join(result.stdout.split())


def ok_json(*args: str) -> dict:  # type: ignore[type-arg]
    return json.loads(ok(*args, "--json").stdout)


def ingest_with_failures(*args: str):  # type: ignore[no-untyped-def]
    """`ragbot ingest` over a folder holding a file that cannot be indexed: the others are, and it exits 3."""
    result = cli("ingest", *args)
    assert result.exit_code == 3, f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def assert_usage_error(result, *needles: str) -> None:  # type: ignore[no-untyped-def]
    """Exit 2 with a single, clear line on stderr and nothing on stdout."""
    assert result.exit_code == 2, f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert result.stdout.strip() == ""


# --- a small folder of documents -------------------------------------------------------------------------------

WIKI_FILES: dict[str, str | bytes] = {
    "garden.md": (
        "# Greenhouse watering\n\nThe greenhouse tomatoes are watered every morning at 6am by the automatic drip "
        "irrigation system. Check the drip lines for clogs every Friday.\n"
    ),
    "kitchen.html": (
        "<html><head><title>Espresso machine</title></head><body><h1>Espresso machine</h1>"
        "<p>The office espresso machine must be descaled every two weeks with citric acid. "
        "Empty the coffee grounds drawer at the end of each day.</p></body></html>"
    ),
    "broken.pdf": b"%PDF-1.7\nthis is not really a pdf at all\n",
    "hr/salaries.md": (
        "# Salary bands\n\nSalary bands for engineers are reviewed every January by the compensation committee. "
        "Band L3 pays between 120k and 150k.\n"
    ),
    "hr/.access": "group:hr\n",
}


def make_wiki(root: Path) -> Path:
    for relative, content in WIKI_FILES.items():
        write(root, relative, content)
    return root


@pytest.fixture
def wiki_db(tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database holding the small wiki, ingested through the CLI as source `wiki`."""
    url = fresh_database()
    monkeypatch.setenv("DATABASE_URL", url)
    ingest_with_failures(str(make_wiki(tmp_path / "wiki")), "--source", "wiki")  # broken.pdf fails
    return url


@pytest.fixture
def on_handbook(handbook_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DATABASE_URL", handbook_url)
    return handbook_url


# --- ingest ------------------------------------------------------------------------------------------------------

def test_ingest_indexes_good_files_reports_the_corrupt_one_and_skips_unchanged(
    tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    wiki = make_wiki(tmp_path / "wiki")

    first = text(ingest_with_failures(str(wiki), "--source", "wiki"))
    assert "wiki: 3 added, 0 updated, 0 unchanged" in first
    assert "1 failed" in first
    assert "failed broken.pdf: could not read .pdf file" in first

    report = json.loads(ingest_with_failures(str(wiki), "--source", "wiki", "--json").stdout)["reports"][0]
    assert report["source"] == "wiki"
    assert report["added"] == [] and report["updated"] == []
    assert report["unchanged"] == 3
    assert [f["id"] for f in report["failed"]] == ["broken.pdf"]

    status = ok_json("status")
    assert [(s["name"], s["kind"], s["documents"]) for s in status["sources"]] == [("wiki", "folder", 3)]
    assert status["documents"] == 3


def test_ingest_defaults_the_source_name_to_the_folder_name(
    tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    write(tmp_path / "notes", "deep/dir/plan.md", "# Plan\n\nThe launch is planned for the third week of March.\n")
    report = ok_json("ingest", str(tmp_path / "notes"))["reports"][0]
    assert report["source"] == "notes"
    assert report["added"] == ["deep/dir/plan.md"]


def test_text_output_shows_brackets_in_names_and_titles_literally(
    tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rich markup must not eat (or crash on) [brackets] that come from file names, titles or paths."""
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    folder = tmp_path / "[team] notes"
    write(folder, "[draft] roadmap.md", "# Roadmap [/v2]\n\nThe zeppelin hangar opens to visitors in [bold] April.\n")
    write(folder, "[old] scan.pdf", b"%PDF-1.7\nnot a pdf\n")
    ingested = text(ingest_with_failures(str(folder), "--source", "[notes]"))
    assert "[notes]: 1 added" in ingested
    assert "failed [old] scan.pdf" in ingested
    found = text(ok("search", "When does the zeppelin hangar open?"))
    assert "Roadmap [/v2]" in found and "[draft] roadmap.md" in found and "[bold] April" in found
    answered = text(ok("ask", "When does the zeppelin hangar open?"))
    assert "[1] Roadmap [/v2]" in answered
    assert "[notes]" in text(ok("status"))


# --- search ------------------------------------------------------------------------------------------------------

def test_search_json_shape_and_pointed_question_ranks_its_document_first(wiki_db: str) -> None:
    results = ok_json("search", "How often is the espresso machine descaled?")["results"]
    assert results, "no results"
    assert [r["rank"] for r in results] == list(range(1, len(results) + 1))
    for r in results:
        assert set(r) == {"rank", "score", "document", "chunk"}
        assert set(r["document"]) == SEARCH_DOCUMENT_KEYS
        assert set(r["chunk"]) == SEARCH_CHUNK_KEYS
        assert isinstance(r["score"], float)
        assert isinstance(r["document"]["id"], int) and isinstance(r["chunk"]["id"], int)
    top = results[0]
    assert top["document"]["external_id"] == "kitchen.html"
    assert top["document"]["source"] == "wiki"
    assert top["document"]["title"] == "Espresso machine"
    assert top["document"]["path"] == "wiki/kitchen.html"
    assert top["document"]["url"].startswith("file://")
    assert "descaled every two weeks" in top["chunk"]["text"]


def test_search_table_output_and_k(wiki_db: str) -> None:
    result = ok("search", "greenhouse tomatoes watering", "-k", "1")
    assert "Greenhouse watering" in result.stdout
    assert len(ok_json("search", "greenhouse tomatoes watering", "-k", "1")["results"]) == 1


@pytest.mark.parametrize("mode", ["lexical", "dense", "hybrid"])
def test_search_modes_find_the_document(wiki_db: str, mode: str) -> None:
    results = ok_json("search", "greenhouse tomatoes drip irrigation", "--mode", mode)["results"]
    assert results[0]["document"]["external_id"] == "garden.md"


def test_search_as_principal_sees_restricted_documents_others_do_not(wiki_db: str) -> None:
    query = "salary bands for engineers"

    def found(*extra: str) -> list[str]:
        return [r["document"]["external_id"] for r in ok_json("search", query, *extra)["results"]]

    assert "hr/salaries.md" not in found()
    assert "hr/salaries.md" not in found("--as", "group:eng", "--as", "user:bob@example.com")
    for mode in ("lexical", "dense"):
        assert "hr/salaries.md" not in found("--mode", mode)
    visible = found("--as", "group:hr")
    assert visible[0] == "hr/salaries.md"
    assert "garden.md" in visible  # documents shared with everyone stay visible


def test_search_source_restricts_results(
    wiki_db: str, tmp_path: Path, fresh_database: Callable[[], str]
) -> None:
    write(tmp_path / "other", "tomatoes.md", "# Tomato recipes\n\nGreenhouse tomatoes make a great soup.\n")
    ok("ingest", str(tmp_path / "other"), "--source", "recipes")

    query = "greenhouse tomatoes"
    both = {r["document"]["source"] for r in ok_json("search", query)["results"]}
    assert both == {"wiki", "recipes"}
    only = ok_json("search", query, "--source", "recipes")["results"]
    assert only and {r["document"]["source"] for r in only} == {"recipes"}
    assert only[0]["document"]["external_id"] == "tomatoes.md"

    assert_usage_error(cli("search", query, "--source", "nope"), "unknown source nope")


# --- ask / chat / run --------------------------------------------------------------------------------------------

def test_ask_json_answers_from_the_handbook_with_a_citation(on_handbook: str) -> None:
    answer = ok_json("ask", "How many PTO days do I get in my first year?")
    assert set(answer) == {"id", "answer", "standalone_query", "mode", "outcome", "abstained", "citations", "evidence",
                           "conversation_id"}
    assert answer["outcome"] in ("answer", "uncertain")
    assert answer["mode"] == "extractive"
    assert answer["abstained"] is False
    assert answer["answer"].strip()
    assert answer["citations"]
    for c in answer["citations"]:
        assert set(c) == CITATION_KEYS
    assert [c["n"] for c in answer["citations"]] == list(range(1, len(answer["citations"]) + 1))
    assert "policies/leave.md" in [c["external_id"] for c in answer["citations"]]
    assert "[1]" in answer["answer"]


def test_ask_abstains_on_an_off_topic_question(on_handbook: str) -> None:
    answer = ok_json("ask", "Who wrote Pride and Prejudice?")
    assert answer["abstained"] is True
    assert answer["citations"] == []
    assert answer["related"] == []  # nothing in the handbook is even close
    assert answer["mode"] == "extractive"
    assert "couldn't find" in answer["answer"]


def test_ask_text_output_lists_citations(on_handbook: str) -> None:
    out = ok("ask", "How many PTO days do I get in my first year?").stdout
    assert "[1]" in out
    assert "policies/leave.md" in "".join(out.split())  # the citation's location (a file:// URL, maybe wrapped)


def test_ask_as_and_source_are_honoured(wiki_db: str) -> None:
    hidden = ok_json("ask", "What is the salary band for L3 engineers?", "--source", "wiki")
    assert "hr/salaries.md" not in [c["external_id"] for c in hidden["citations"]]
    shown = ok_json("ask", "What is the salary band for L3 engineers?", "--as", "group:hr")
    assert not shown["abstained"]
    assert shown["citations"][0]["external_id"] == "hr/salaries.md"


@pytest.mark.parametrize("command", ["chat", "run"])
def test_terminal_chat_answers_with_a_citation_until_quit(on_handbook: str, command: str) -> None:
    result = ok(command, input="How often are laptops refreshed?\n/quit\nWho wrote Pride and Prejudice?\n")
    out = result.stdout
    assert "Type exit or /quit" in out
    assert "you>" in out
    assert out.count("ragbot>") == 1  # the question after /quit is never asked
    assert "[1]" in out
    assert "it/equipment.html" in "".join(out.split())


def test_chat_ends_at_end_of_input(on_handbook: str) -> None:
    out = ok("chat", input="How often are laptops refreshed?\n\n").stdout
    assert out.count("ragbot>") == 1


# --- status / db -------------------------------------------------------------------------------------------------

def test_status_lists_the_handbook(on_handbook: str) -> None:
    status = ok_json("status")
    assert status["embedding_model"] == "all-MiniLM-L6-v2" and status["embedding_dimension"] == 384
    [handbook] = status["sources"]
    assert handbook["name"] == "handbook" and handbook["kind"] == "folder"
    assert handbook["documents"] == status["documents"] > 20
    assert handbook["chunks"] == status["chunks"] > handbook["documents"]
    assert "handbook" in ok("status").stdout


def test_db_upgrade_prints_the_revision(fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    out = ok("db", "upgrade").stdout
    assert out.startswith("Database schema is at revision ")
    revision = out.strip().removeprefix("Database schema is at revision ").rstrip(".")
    assert revision and revision != "None"
    assert ok("db", "upgrade").stdout == out  # idempotent


def test_db_stop_with_database_url_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@localhost:1/nothing")
    assert_usage_error(cli("db", "stop"), "DATABASE_URL is set")


# --- eval --------------------------------------------------------------------------------------------------------

def test_eval_jsonl_prints_every_metric_for_every_mode(on_handbook: str, tmp_path: Path) -> None:
    questions = [
        {"question": "How many PTO days do I get in my first year?", "relevant": ["policies/leave.md"]},
        {"question": "How many sick days do we get per year?", "relevant": ["policies/sick-leave.md"]},
        {"question": "How often are laptops refreshed?", "relevant": ["it/equipment.html"]},
        {"question": "Who wrote Pride and Prejudice?", "relevant": []},  # unanswerable: left out of ranking
    ]
    path = write(tmp_path, "eval.jsonl", "\n".join(json.dumps(q) for q in questions) + "\n")
    results = ok_json("eval", str(path))
    assert set(results) == {"hybrid", "dense", "lexical"}
    for mode, metrics in results.items():
        assert set(metrics) == METRIC_KEYS, mode
        assert all(0.0 <= v <= 1.0 for v in metrics.values()), (mode, metrics)
    assert results["hybrid"]["recall@100"] == 1.0
    assert results["hybrid"]["ndcg@10"] > 0.5

    only = ok_json("eval", str(path), "--mode", "lexical")
    assert set(only) == {"lexical"} and set(only["lexical"]) == METRIC_KEYS
    table = ok("eval", str(path), "--mode", "dense").stdout
    assert "dense" in table and "ndcg@10" in table


def test_eval_on_an_empty_index_says_what_to_index_instead_of_scoring_zero(
    fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    questions = str(REPO / "examples" / "handbook" / "eval.jsonl")
    assert_usage_error(cli("eval", questions), "index is empty", "ragbot ingest examples/handbook", "--corpus")
    # --answers would decline every question, which would score as perfect abstention
    assert_usage_error(cli("eval", "--answers", questions), "index is empty", "ragbot ingest examples/handbook")


BEIR_CORPUS = [
    ("d1", "Volcanoes", "Volcanic eruptions eject lava, ash and gases from magma chambers beneath the crust."),
    ("d2", "Honeybees", "Honeybees communicate the location of flowers to the hive with a waggle dance."),
    ("d3", "Glaciers", "Glaciers carve U-shaped valleys as the ice slowly flows downhill under its own weight."),
    ("d4", "Photosynthesis", "Plants convert sunlight, water and carbon dioxide into glucose and oxygen."),
    ("d5", "Tides", "Ocean tides are caused mainly by the gravitational pull of the moon on the oceans."),
    ("d6", "Penguins", "Emperor penguins huddle together to survive the Antarctic winter cold."),
    ("d7", "Comets", "A comet's tail always points away from the sun, pushed by the solar wind."),
    ("d8", "Coral reefs", "Coral bleaching happens when warm water makes corals expel their symbiotic algae."),
]
BEIR_QUERIES = [
    ("q1", "How do bees tell each other where flowers are?", "d2"),
    ("q2", "What causes the tides in the ocean?", "d5"),
    ("q3", "Why do corals lose their color in warm water?", "d8"),
]


def make_beir(root: Path) -> Path:
    write(root, "corpus.jsonl", "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in BEIR_CORPUS))
    write(root, "queries.jsonl", "".join(json.dumps({"_id": q, "text": x}) + "\n" for q, x, _ in BEIR_QUERIES))
    write(root, "qrels/test.tsv", "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, _, d in BEIR_QUERIES))
    return root


def test_eval_beir_ingests_its_own_source_and_reuses_the_index(
    tmp_path: Path, fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    write(tmp_path / "other", "bees.md", "# Bees\n\nHoneybees tell each other where flowers are with a dance.\n")
    ok("ingest", str(tmp_path / "other"), "--source", "other")  # must not leak into the BEIR search
    beir = make_beir(tmp_path / "tinybeir")

    first = ok("eval", "--beir", str(beir), "--json")
    results = json.loads(first.stdout)
    assert set(results) == {"hybrid", "dense", "lexical"}
    for metrics in results.values():
        assert set(metrics) == METRIC_KEYS
    assert results["hybrid"]["ndcg@10"] > 0
    assert results["hybrid"]["recall@100"] == 1.0
    assert "beir-tinybeir: 8 indexed, 0 cached" in first.stderr

    second = ok("eval", "--beir", str(beir), "--json")
    assert "beir-tinybeir: 0 indexed, 8 cached" in second.stderr
    assert json.loads(second.stdout) == results

    status = ok_json("status")
    assert {s["name"]: (s["kind"], s["documents"]) for s in status["sources"]} == {
        "beir-tinybeir": ("beir", 8), "other": ("folder", 1),
    }
    # Benchmark documents are indexed for the eval principal only: they never show up in anyone's search.
    query = BEIR_QUERIES[0][1]
    assert all(r["document"]["source"] == "other" for r in ok_json("search", query)["results"])


# --- bad input ---------------------------------------------------------------------------------------------------

def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, on_handbook: str) -> None:
    missing = tmp_path / "a" / "rather" / "long" / "path" / "that" / "does" / "not" / "exist" / "anywhere" / "at-all"
    assert_usage_error(cli("ingest", str(missing)), "no such file or folder", "at-all")
    assert_usage_error(cli("ingest", str(tmp_path), str(missing)), "no such file or folder")
    assert_usage_error(cli("ingest", str(tmp_path / "[/draft]")), "no such file or folder: ", "[/draft]")
    assert_usage_error(cli("search", "   "), "empty")
    assert_usage_error(cli("search", ""), "empty")
    assert_usage_error(cli("ask", ""), "empty")
    assert_usage_error(cli("ask", "  \t "), "empty")
    assert_usage_error(cli("search", "leave", "--mode", "fuzzy"), "--mode")
    assert_usage_error(cli("eval", str(missing)), "no such file or folder")
    assert_usage_error(cli("eval", "--beir", str(missing)), "no such file or folder")
    assert_usage_error(cli("eval"), "--beir")
    assert_usage_error(cli("eval", "--mode", "fuzzy", str(REPO / "examples" / "handbook" / "eval.jsonl")), "--mode")
    bad = write(tmp_path, "bad.jsonl", "not json\n")
    assert_usage_error(cli("eval", str(bad)), "bad.jsonl:1")
    empty_beir = tmp_path / "emptybeir"
    empty_beir.mkdir()
    assert_usage_error(cli("eval", "--beir", str(empty_beir)), "corpus.jsonl")


# --- the installed console script --------------------------------------------------------------------------------

def test_installed_console_script_runs(on_handbook: str) -> None:
    env = {**os.environ, "DATABASE_URL": on_handbook}
    done = subprocess.run([str(RAGBOT), "status", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert [s["name"] for s in status["sources"]] == ["handbook"]

    done = subprocess.run([str(RAGBOT), "ask", ""], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == ["Error: the question is empty"]


def test_unreachable_database_is_a_one_line_error_without_the_password(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://bob:hunter2@127.0.0.1:1/ragbot")
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 2
    assert "cannot connect to" in result.stderr and "Check DATABASE_URL" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


def test_search_updated_after_filters_old_documents(fresh_database, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    docs = tmp_path / "dated"
    write(docs, "old.md", "# Old VPN\n\nThe VPN client used to be Cisco AnyConnect.")
    write(docs, "new.md", "# New VPN\n\nThe VPN client is Tailscale.")
    os.utime(docs / "old.md", (1_500_000_000, 1_500_000_000))  # 2017
    assert runner.invoke(app, ["ingest", str(docs)]).exit_code == 0
    result = runner.invoke(app, ["search", "vpn client", "--updated-after", "2020-01-01", "--json"])
    assert result.exit_code == 0
    assert [r["document"]["external_id"] for r in json.loads(result.stdout)["results"]] == ["new.md"]


def test_a_password_that_is_not_url_encoded_gets_a_fix_and_is_not_printed(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://bob:p@ss#word@127.0.0.1:1/ragbot")
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 2
    assert "URL-encode" in result.stderr
    assert "ss#word" not in result.stderr + result.stdout


def test_remove_source_forgets_its_documents(fresh_database, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", fresh_database())
    write(tmp_path / "old-wiki", "page.md", "# Page\n\nArchived content.")
    assert runner.invoke(app, ["ingest", str(tmp_path / "old-wiki")]).exit_code == 0
    result = runner.invoke(app, ["remove-source", "old-wiki"])
    assert result.exit_code == 0 and "1 documents" in result.stdout
    assert json.loads(runner.invoke(app, ["status", "--json"]).stdout)["documents"] == 0
    missing = runner.invoke(app, ["remove-source", "old-wiki"])
    assert missing.exit_code == 2 and "unknown source" in missing.stderr
