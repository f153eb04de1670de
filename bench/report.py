"""Render BENCHMARKS.md from bench/results/*.json (run by `make bench` after the benchmarks).

    PYTHONPATH=. .venv/bin/python bench/report.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "BENCHMARKS.md"

HEADER = """# Benchmarks

Every figure here was measured by a script in `bench/` and read from `bench/results/<name>.json`, which also
records the machine (cores, RAM, CPU, load average when the run started, package and Postgres versions, commit).
Each latency or throughput sits beside a floor measured **in the same run on the same machine**: on a shared or
busy machine absolute figures move a lot, the ratios much less. Targets are read here, never asserted in tests.

## Reproduce

```
make bench                                                       # quick set: 10k search, small ingest, bot; < 5 min
.venv/bin/python bench/search.py --chunks 10k,100k               # 100k: about 12 min on 2 cores (idle)
.venv/bin/python bench/search.py --chunks 1M --queries 100 --recall-queries 10 --keep   # 1M: 25 min to 1 h by machine (load 9–30 min, graph 4–8, 0.5–1 min per recall question)
.venv/bin/python bench/search.py --chunks 100k --queries 100 --recall-queries 20 --sources 10 --layout single,partitioned --name partitions   # one table against partitions by source
.venv/bin/python bench/ingest.py --documents 400 --store-chunks 20000 --base-chunks 100000
.venv/bin/python bench/bot_bench.py                                    # bot overhead, ack, `ragbot run` RSS: ≈ 1 min idle
.venv/bin/python bench/bot_bench.py --mentions 300 --skip-rss          # more samples, overhead and ack only
.venv/bin/python bench/report.py                                 # rewrites this file from bench/results/
```
Without `DATABASE_URL` each run starts a throwaway embedded Postgres in a temporary `RAGBOT_HOME`; with it, the
benchmarks create and drop their own databases (`ragbot_bench_*`) on that server.
"""


def _load(name: str) -> dict | None:  # type: ignore[type-arg]
    path = HERE / "results" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _machine(result: dict) -> str:  # type: ignore[type-arg]
    m = result.get("machine", {})
    versions = m.get("versions", {})
    return (f"_Measured {result.get('measured_at', '?')} on {m.get('cores')} cores, {m.get('ram_gb')} GB RAM "
            f"({m.get('cpu')}), load average at start {m.get('load_average_at_start')}; Postgres "
            f"{m.get('postgres')} (shared_buffers {m.get('shared_buffers', '?')}), pgvector {m.get('pgvector')}, "
            f"torch {versions.get('torch')}, "
            f"commit {m.get('git_commit')}." + _probes(m) + "_")


def _probes(m: dict) -> str:  # type: ignore[type-arg]
    """The machine's speed on fixed work at the end of the run (bench/common.py speed_probes; lower is faster)."""
    if "cpu_probe_ms" not in m:
        return ""
    return f" Speed probes (fixed work, lower is faster): CPU {m['cpu_probe_ms']} ms, memory {m['memory_probe_ms']} ms."


def search_section(result: dict) -> str:  # type: ignore[type-arg]
    sizes = result.get("sizes", {})
    order = sorted(sizes, key=int)
    lines = ["## Search (`bench/search.py`)", "", _machine(result) + " Sizes measured in other runs keep the date and "
             "load average of their own run (rows below).", "",
             "p50 / p95 / p99 in ms of `KnowledgeBase.search` (k = 10). *filtered*: the asker may see 10% of the "
             "documents. *cached query*: the query vector comes from the product's query cache; otherwise the "
             "question is embedded in the call (a question of the handbook's eval set in place of the synthetic "
             "one, whose pseudo-words split into twice the tokens; the searched vector is planted either way: "
             "`bench/common.py`). Floor: a bare HNSW top-10 over the same pool and query vectors (*raw driver*: the "
             "same through psycopg alone, without SQLAlchemy or a pool checkout; measured since 2026-11-25).", ""]
    header = "| | " + " | ".join(f"{int(s):,} chunks" for s in order) + " |"
    lines += [header, "|---" * (len(order) + 1) + "|"]
    keys = ["hybrid", "hybrid_filtered", "dense", "dense_filtered", "lexical", "lexical_filtered",
            "hybrid_cached_query", "hybrid_filtered_cached_query", "dense_cached_query",
            "raw_sql", "raw_sql_filtered", "raw_driver"]
    for key in keys:
        cells = []
        for s in order:
            row = sizes[s].get("latency_ms", {}).get(key)
            cells.append(f"{row['p50']} / {row['p95']} / {row['p99']}" if row else "–")
        lines.append(f"| {key.replace('_', ' ')} | " + " | ".join(cells) + " |")
    facts = [
        ("measured at (UTC)", "measured_at"),
        ("how (where runs were combined)", "note"),
        ("load average at start", "load_average_at_start"),
        ("hybrid filtered p95 ÷ floor p95", "hybrid_filtered_vs_floor_p95"),
        ("HNSW recall@10 vs exact", "hnsw_recall@10"),
        ("HNSW recall@10 vs exact, filtered", "hnsw_filtered_recall@10"),
        ("HNSW best hit = exact best hit (all / filtered)", "hnsw_top1_pair"),
        ("HNSW search list (hnsw.ef_search)", "hnsw_ef_search"),
        ("lexical recall@10 vs exact BM25", "lexical_recall@10"),
        ("searches returning < 10 results (of the timed ones)", "searches_with_fewer_than_10_results"),
        ("question tokens embedded, p50 / p95", "question_tokens"),
        ("store path while loading (chunks/s, first-sync bulk load: no HNSW until the end)", "store_chunks_per_s"),
        ("HNSW build (s)", "hnsw_build_s"),
        ("chunks table incl. indexes and TOAST (MB)", "chunks_table_mb"),
        ("of which indexes (MB)", "indexes_mb"),
        ("bytes per chunk (all of it)", "bytes_per_chunk"),
        ("vocabulary (lexemes)", "vocabulary"),
    ]
    for label, key in facts:
        cells = []
        for s in order:
            value = sizes[s].get(key, "–")
            if key == "hnsw_top1_pair":
                pair = (sizes[s].get("hnsw_top1_agreement"), sizes[s].get("hnsw_filtered_top1_agreement"))
                value = f"{pair[0]} / {pair[1]}" if pair[0] is not None else "– (measured since 2026-11-25, 4th round)"
            elif key == "hnsw_ef_search" and value == "–":
                value = "100 (before 2026-11-25, 4th round)"
            elif key == "question_tokens":
                value = (f"{value['embedded']['p50']} / {value['embedded']['p95']} (synthetic question: "
                         f"{value['synthetic']['p50']} / {value['synthetic']['p95']})"
                         if isinstance(value, dict) else "the synthetic question's (before 2026-11-23, 2nd round)")
            elif isinstance(value, dict):
                value = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in value.items() if v) or "none"
            cells.append(str(value))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    index_rows = {name for s in order for name in sizes[s].get("index_mb", {})}
    for name in sorted(index_rows):
        lines.append(f"| index {name} (MB) | " + " | ".join(str(sizes[s].get("index_mb", {}).get(name, "–"))
                                                           for s in order) + " |")
    return "\n".join(lines) + "\n"


def levers_section(result: dict) -> str:  # type: ignore[type-arg]
    lines = ["## Levers (`bench/search.py --levers`)", "", _machine(result), "",
             "recall@10 against exact search and p50 / p95 in ms, same run, same queries.", "",
             "| size | lever | recall@10 | p50 | p95 | build s | index MB |", "|---|---|---|---|---|---|---|"]
    for size, figures in sorted(result.get("sizes", {}).items(), key=lambda item: int(item[0])):
        if figures.get("levers_measured_at"):
            lines.insert(4, f"{int(size):,} chunks: levers measured {figures['levers_measured_at']}.\n")
        for lever, row in figures.get("levers", {}).items():
            lines.append(f"| {int(size):,} | {lever.replace('_', ' ')} | {row.get('recall@10')} | {row.get('p50')} | "
                         f"{row.get('p95')} | {row.get('build_s', '')} | {row.get('index_mb', '')} |")
    return "\n".join(lines) + "\n"



def _runs(result: dict, key: str) -> str:  # type: ignore[type-arg]
    """The runs behind a figure that is their median ("; median of 3 runs: a / b / c"), or nothing."""
    runs = result.get(f"{key}_runs")
    return f"; median of {len(runs)} runs: {' / '.join(str(r) for r in runs)}" if runs else ""


def ingest_section(result: dict) -> str:  # type: ignore[type-arg]
    r = result
    lines = ["## Ingest (`bench/ingest.py`)", "", _machine(result), "",
             "| measurement | figure | beside it (same run) | ratio |", "|---|---|---|---|",
             f"| end-to-end sync of {r.get('documents')} Markdown documents ({r.get('chunks')} chunks) | "
             f"{r.get('ingest_chunks_per_s')} chunks/s | `model.encode` alone on the same texts: "
             f"{r.get('encode_chunks_per_s')} chunks/s ({r.get('embedding_device')}) | {r.get('ingest_vs_encode_ratio')} |",
             f"| store path, precomputed embeddings, HNSW maintained ({r.get('store_chunks')} chunks into "
             f"{r.get('store_base_chunks')}, {r.get('store_writers', 1)} writer(s), "
             f"{r.get('store_transactions', '?')} transactions{_runs(r, 'store_chunks_per_s')}) | "
             f"{r.get('store_chunks_per_s')} chunks/s | bare COPY of the same rows into an unindexed table: "
             f"{r.get('copy_chunks_per_s')} chunks/s | {r.get('store_vs_copy_ratio')} |",
             f"| store path of a first sync ({r.get('store_base_chunks')} chunks into the empty index, written without "
             f"the HNSW graph, then the graph built: {r.get('store_first_sync_graph_build_s')} s, included) | "
             f"{r.get('store_first_sync_chunks_per_s')} chunks/s | the writes alone: "
             f"{r.get('store_without_hnsw_chunks_per_s')} chunks/s | |",
             f"| re-sync, nothing changed | {r.get('unchanged_resync_s')} s | first sync {r.get('first_sync_s')} s | "
             f"{r.get('unchanged_resync_speedup')}× faster |",
             f"| re-sync, 1% of documents edited ({r.get('one_percent_changed_documents')}) | "
             f"{r.get('one_percent_changed_resync_s')} s | first sync {r.get('first_sync_s')} s | "
             f"{r.get('one_percent_changed_resync_speedup')}× faster |",
             f"| BM25 re-weighting after an avgdl drift ({r.get('reweight_chunks')} chunks, batches of 2,000 in "
             f"their own transactions) | {r.get('reweight_chunks_per_s')} chunks/s | longest lock hold ≈ "
             f"{r.get('reweight_batch_max_s')} s | |"]
    return "\n".join(lines) + "\n"

BOT_STAGES = {  # bench/bot_bench.py's stages_ms, in path order
    "post_to_handler": "· client POST → the app's handler starts",
    "handler_to_kb_answer": "· handler → `KnowledgeBase.answer` called (dispatch, exactly-once claim, audience)",
    "memory": "· conversation memory",
    "retrieval": "· retrieval (query embedding + hybrid SQL)",
    "after_retrieval": "· prompt building + the SDK's request, until the server has read it",
    "overhead_without_retrieval": "overhead minus retrieval: the bot's own part",
    "floor_embed": "· floor: query embedding",
    "floor_sql": "· floor: after the question is embedded (SQL, fusion)",
}


def _met(value: object, target: float) -> str:
    return "–" if not isinstance(value, (int, float)) else ("yes" if value <= target else "**no**")


def bot_section(result: dict) -> str:  # type: ignore[type-arg]
    r = result
    targets = r.get("targets", {"overhead_p95_ms": 150, "ack_p95_ms": 50, "rss_mb": 1024})
    m = r.get("machine", {})
    corpus = r.get("corpus", {})
    overhead, ack, floor = r.get("overhead_ms", {}), r.get("ack_ms", {}), r.get("floor_search_ms", {})
    from_post = r.get("overhead_from_post_ms", {})
    lines = ["## Bot (`bench/bot_bench.py`)", "", _machine(result) + f" _Load average at end {m.get('load_average_at_end')}._",
             "",
             f"The real Slack app (`bot.app.BotApp` with slack-bolt's AsyncApp, HTTP mode) against the fake Slack API "
             f"and, through the anthropic SDK, the fake Anthropic server; {corpus.get('documents')} handbook "
             f"documents ({corpus.get('chunks')} chunks); {r.get('mentions')} signed `app_mention` events, one at a "
             f"time, each in a channel of its own, questions from `examples/handbook/eval.jsonl` (query-vector cache "
             f"emptied before each). *Overhead*: the app's POST /slack/events handler starts → the fake Anthropic "
             f"server has read "
             f"the Messages request (claim, audience, memory, retrieval, prompt, SDK). Floor: the bare "
             f"`KnowledgeBase.search` of the same question (same principals and k, query embedded), interleaved.", "",
             "| measurement | p50 | p95 | p99 | target | met |", "|---|---|---|---|---|---|",
             f"| overhead: handler start → LLM request (ms) | {overhead.get('p50')} | {overhead.get('p95')} | "
             f"{overhead.get('p99')} | p95 ≤ {targets['overhead_p95_ms']:g} | {_met(r.get('overhead_p95_ms'), targets['overhead_p95_ms'])} |",
             f"| same, from the client's POST (ms) | {from_post.get('p50')} | {from_post.get('p95')} | "
             f"{from_post.get('p99')} | | |",
             f"| floor: bare `KnowledgeBase.search` (ms) | {floor.get('p50')} | {floor.get('p95')} | {floor.get('p99')} "
             f"| | |",
             f"| ack: POST → HTTP 200 read (ms) | {ack.get('p50')} | {ack.get('p95')} | {ack.get('p99')} | "
             f"p95 ≤ {targets['ack_p95_ms']:g} | {_met(r.get('ack_p95_ms'), targets['ack_p95_ms'])} |"]
    for name, label in BOT_STAGES.items():
        row = r.get("stages_ms", {}).get(name)
        if row:
            lines.append(f"| {label} (ms) | {row.get('p50')} | {row.get('p95')} | {row.get('p99')} | | |")
    lines += ["", f"Overhead p95 ÷ floor p95: {r.get('overhead_vs_floor_p95')}. Encoders in the process: "
              f"sentence-transformers loaded {r.get('encoders', {}).get('sentence_transformers_loaded')}, questions "
              f"embedded by {r.get('encoders', {}).get('query_encoder')}."]
    if "rss_mb" in r:
        pg = r.get("postgres_memory", {})
        lines += ["", "| `ragbot run` (subprocess, HTTP mode, env-configured) | figure | target | met |", "|---|---|---|---|",
                  f"| peak RSS of the bot process (VmHWM) after {r.get('rss_mentions_answered')} answered mentions | "
                  f"{r.get('rss_mb')} MB | ≤ {targets['rss_mb']:g} MB | {_met(r.get('rss_mb'), targets['rss_mb'])} |",
                  f"| peak RSS when /healthz first answered 200 (model loaded) | {r.get('rss_at_healthy_mb')} MB | | |",
                  f"| start → /healthz 200 | {r.get('startup_to_healthy_s')} s | | |",
                  f"| POST → LLM request, per mention (the first pays lazy loading) | "
                  f"{', '.join(str(x) for x in r.get('ragbot_run_post_to_llm_ms', []))} ms | | |",
                  f"| torch loaded in the bot process | {r.get('rss_torch_loaded')} | | |",
                  f"| syncs `ragbot run` ran meanwhile (only scheduled sources sync in it) | "
                  f"{r.get('rss_syncs_run_by_ragbot_run', '–')} | | |",
                  f"| Postgres: {pg.get('processes')} processes, RSS summed / PSS summed | {pg.get('rss_sum_mb')} MB / "
                  f"{pg.get('pss_sum_mb')} MB | | |",
                  f"| Postgres: largest single process peak RSS | {pg.get('largest_process_peak_rss_mb')} MB | | |"]
    return "\n".join(lines) + "\n"


def bot_platforms_section(result: dict) -> str:  # type: ignore[type-arg]
    """The three platforms side by side (bench/results/bot_platforms.json: `bench/bot_bench.py --teams-mentions
    --discord-mentions --name bot_platforms`), a subsection of the Bot section."""
    r = result
    m = r.get("machine", {})
    targets = r.get("targets", {"overhead_p95_ms": 150, "ack_p95_ms": 50})
    teams, discord = r.get("teams", {}), r.get("discord", {})
    corpus = r.get("corpus", {})
    slack_o, slack_ack, floor = r.get("overhead_ms", {}), r.get("ack_ms", {}), r.get("floor_search_ms", {})
    teams_o, teams_ack = teams.get("overhead_ms", {}), teams.get("ack_ms", {})
    discord_o, to_handler = discord.get("overhead_ms", {}), discord.get("to_handler_ms", {})
    posted = discord.get("to_answer_posted_ms", {})
    abstained = r.get("mentions_without_llm_call", 0)
    lines = ["### The three platforms side by side (`--teams-mentions`, `--discord-mentions`)", "",
             _machine(result) + f" _Load average at end {m.get('load_average_at_end')}._", "",
             f"    .venv/bin/python bench/bot_bench.py --mentions {r.get('mentions')} --warmup {r.get('warmup_mentions')} "
             f"--teams-mentions {teams.get('mentions')} --discord-mentions {discord.get('mentions')} \\",
             "        --skip-rss --name bot_platforms                      # → bench/results/bot_platforms.json", "",
             f"Each platform's real client library against its fake (tests/fakes/), the handbook "
             f"({corpus.get('documents')} documents, {corpus.get('chunks')} chunks) synced into a database of its own, "
             f"the fake Anthropic server behind the real anthropic SDK, {r.get('mentions')} timed @mentions (after "
             f"{r.get('warmup_mentions')} warm-ups), one at a time, each a new thread, questions from "
             f"`examples/handbook/eval.jsonl`, query-vector cache emptied before each; "
             + ("every mention reached the LLM (no abstention)." if not abstained else
                f"{abstained} Slack mention(s) abstained before the LLM (not counted).")
             + " *Overhead* = the event reaches the bot → the fake Anthropic server has read the Messages request:",
             "- Slack: slack-bolt's app behind `BotApp`'s aiohttp server, signed `app_mention` POSTs; from the POST "
             "/slack/events handler entered. Each mention's channel is a public channel the fake describes "
             "(conversations.info answers).",
             "- Teams: the Microsoft 365 Agents SDK's `TeamsAdapter` behind `BotApp`, activities signed by the fake Bot "
             "Connector (JWT validated against its JWKS); from `TeamsPlatform.handle` entered (before the JWT check), in "
             "standard channels.",
             "- Discord: discord.py's `RagbotDiscord` logged in to the fake REST API; a gateway has no request to time, "
             "so from the MESSAGE_CREATE payload handed to discord.py's own gateway parser "
             "(tests/fakes/discord_gateway.py); the bot opens a thread over REST (inside the overhead) and answers "
             "there; edit pacing off (as in the tests).", "",
             "| platform | overhead p50 (ms) | p95 | p99 | ack / first step p50 (ms) | p95 |", "|---|---|---|---|---|---|",
             f"| Slack | {slack_o.get('p50')} | {slack_o.get('p95')} | {slack_o.get('p99')} | ack: POST → HTTP 200 read "
             f"{slack_ack.get('p50')} | {slack_ack.get('p95')} |",
             f"| Teams | {teams_o.get('p50')} | {teams_o.get('p95')} | {teams_o.get('p99')} | ack: POST → HTTP 202 read "
             f"{teams_ack.get('p50')} | {teams_ack.get('p95')} |",
             f"| Discord | {discord_o.get('p50')} | {discord_o.get('p95')} | {discord_o.get('p99')} | MESSAGE_CREATE → "
             f"`on_message` entered {to_handler.get('p50')} | {to_handler.get('p95')} |",
             f"| floor: bare `KnowledgeBase.search`, same run (Slack case) | {floor.get('p50')} | {floor.get('p95')} | "
             f"{floor.get('p99')} | | |", ""]
    overheads = [o.get("p95") for o in (slack_o, teams_o, discord_o)]
    acks = [a.get("p95") for a in (slack_ack, teams_ack)]
    within = [isinstance(v, (int, float)) and v <= targets["overhead_p95_ms"] for v in overheads]
    acks_within = [isinstance(v, (int, float)) and v <= targets["ack_p95_ms"] for v in acks]
    lines.append(
        ("All three are" if all(within) else "Not all three are") + f" within the overhead target (p95 ≤ "
        f"{targets['overhead_p95_ms']:g} ms)" + (" and" if all(within) == all(acks_within) else ", but not all")
        + f" within the ack target (p95 ≤ {targets['ack_p95_ms']:g} ms). Discord, event → the answer's last REST call "
        f"in its thread (the fake LLM's reply included): p50 {posted.get('p50')} ms, p95 {posted.get('p95')} ms.")
    return "\n".join(lines) + "\n"


# The targets for this 2-core machine: (label, results file, path to the figure, at most / at least, bound).
# A results file that records its own targets (bench/bot_bench.py's TARGETS) overrides the bound here.
TARGETS: list[tuple[str, str, tuple[str, ...], str, float]] = [
    ("hybrid p95 at 100k, 10% reader, question embedded (ms)", "search",
     ("sizes", "100000", "hybrid_filtered_p95_ms"), "≤", 25),
    ("… ÷ the bare HNSW floor's p95 beside it", "search", ("sizes", "100000", "hybrid_filtered_vs_floor_p95"), "≤", 5),
    ("hybrid p95 at 1M, 10% reader (ms)", "search", ("sizes", "1000000", "hybrid_filtered_p95_ms"), "≤", 80),
    ("lexical recall@10 against exact BM25 at 10k", "search", ("sizes", "10000", "lexical_recall@10"), "≥", 0.98),
    ("lexical recall@10 against exact BM25 at 100k", "search", ("sizes", "100000", "lexical_recall@10"), "≥", 0.98),
    ("lexical recall@10 against exact BM25 at 1M", "search", ("sizes", "1000000", "lexical_recall@10"), "≥", 0.98),
    ("store path with the graph maintained (chunks/s)", "ingest", ("store_chunks_per_s",), "≥", 1000),
    ("ingest ÷ `model.encode` alone", "ingest", ("ingest_vs_encode_ratio",), "≥", 0.9),
    ("unchanged re-sync, times faster than the first", "ingest", ("unchanged_resync_speedup",), "≥", 50),
    ("bot overhead p95 (ms)", "bot", ("overhead_p95_ms",), "≤", 150),
    ("ack p95 (ms)", "bot", ("ack_p95_ms",), "≤", 50),
    ("peak RSS of `ragbot run` (MB)", "bot", ("rss_mb",), "≤", 1024),
]


def targets_section(results: dict[str, dict | None]) -> str:  # type: ignore[type-arg]
    """Each target beside the figure in the latest results and when that was measured: read from the results
    files, so it is never staler than they are."""
    lines = ["## Targets", "",
             "The issue's targets for this 2-core machine, each against the latest figure in `bench/results/`. "
             "This machine's speed drifts within a day (10-15% on the CPU probe, up to 40% on the memory probe): compare runs by their speed probes.", "",
             "| target | figure | bound | met | measured (UTC) |", "|---|---|---|---|---|"]
    for label, name, path, sense, bound in TARGETS:
        node: object = results.get(name) or {}
        measured = node.get("measured_at", "–") if isinstance(node, dict) else "–"
        if isinstance(node, dict):
            bound = node.get("targets", {}).get(path[-1], bound)  # a bench that records its targets (bench/bot_bench.py)
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and "measured_at" in node:
                measured = node["measured_at"]  # a size measured in a run of its own
        if not isinstance(node, (int, float)):
            lines.append(f"| {label} | – | {sense} {bound:g} | not measured | – |")
            continue
        met = node <= bound if sense == "≤" else node >= bound
        lines.append(f"| {label} | {node:g} | {sense} {bound:g} | {'yes' if met else '**no**'} | {measured} |")
    return "\n".join(lines) + "\n"


def scale_section(scale: dict | None, workers: dict | None) -> str:  # type: ignore[type-arg]
    """Past one machine: a real standby and PgBouncer (bench/scale.py), several sync workers (bench/sync_workers.py)."""
    lines = ["## Past one machine (`bench/scale.py`, `bench/sync_workers.py`)", ""]
    if scale:
        lines += [_machine(scale), "",
                  f"A primary, a streaming hot standby (`pg_basebackup -R`) and PgBouncer 1.18 (transaction mode) on "
                  f"this machine; the handbook ({scale.get('chunks')} chunks); the eval set's {scale.get('questions')} "
                  f"questions searched (hybrid, k=10) {scale.get('rounds')} times through each path, after a warm-up. "
                  f"Same hits on every path: {scale.get('same_hits_on_every_path')}; the standby served the reads: "
                  f"{scale.get('standby_served_reads')}.", "",
                  "| path | p50 (ms) | p95 (ms) | p99 (ms) |", "|---|---|---|---|"]
        for name in ("primary", "standby", "pgbouncer"):
            row = scale.get(f"hybrid_ms_{name}", {})
            lines.append(f"| {name} | {row.get('p50')} | {row.get('p95')} | {row.get('p99')} |")
        visible = scale.get("standby_visible_after_sync_ms", {})
        lines += ["", f"A synced document visible on the standby after the sync returned: p50 {visible.get('p50')} ms, "
                  f"max of {visible.get('n')} trials {visible.get('p99')} ms.", ""]
    if workers:
        lines += [_machine(workers), "", "Real `ragbot scheduler` processes over four folder sources (each a copy of "
                  "the handbook's Markdown pages), from the first run's start to the last run's end:", "",
                  "| workers | documents | all sources synced (s) | each source's run (s) |", "|---|---|---|---|"]
        for key in sorted(k for k in workers if k.endswith("_workers") and not k.startswith("big_")):
            row = workers[key]
            lines.append(f"| {row.get('workers')} | {row.get('documents')} | {row.get('all_sources_synced_s')} | "
                         f"{', '.join(str(x) for x in row.get('per_source_s', []))} |")
    big = sorted(k for k in (workers or {}) if k.startswith("big_") and k != "big_machine")
    if big:
        first = workers[big[0]]
        lines += ["", _machine(workers.get("big_machine", {})), "", f"One big folder source ({first.get('folders')} top-level folders, each some of the handbook's "
                  "Markdown pages), its first sync split by folder (`SYNC_SPLIT_FIRST`, knowledge.ingest.split): real "
                  "`ragbot scheduler` processes started together, from the first run's start to the end of the run "
                  "that published the source (the second worker's start-up and model load count):", "",
                  "| workers | split | documents | published after (s) | documents added by each run |",
                  "|---|---|---|---|---|"]
        for key in big:
            row = workers[key]
            lines.append(f"| {row.get('workers')} | {'yes' if row.get('split', True) else 'no (one unit)'} | "
                         f"{row.get('documents')} | {row.get('published_s')} | "
                         f"{', '.join(str(x) for x in row.get('documents_per_run', []))} |")
    return "\n".join(lines) + "\n"


PARTITIONS_COMMAND = ("PYTHONPATH=. .venv/bin/python bench/search.py --chunks 100k --queries 100 --recall-queries 20 "
                      "--sources 10 --layout single,partitioned --name partitions")
PARTITIONS_1M_COMMAND = ("PYTHONPATH=. nice -n 10 .venv/bin/python bench/search.py --chunks 1M --queries 100 "
                         "--recall-queries 10 --sources 10 --layout single,partitioned --name partitions-1m")


def partitions_section(results: list[dict]) -> str:  # type: ignore[type-arg]
    """`chunks` as one table (migration 0018) against partitioned by source (0019), on one load moved between them by
    the migration (bench/search.py --sources 10 --layout single,partitioned)."""
    lines = ["## Partitions by source (`bench/search.py --sources 10 --layout single,partitioned`)", "",
             f"    {PARTITIONS_COMMAND}", f"    {PARTITIONS_1M_COMMAND}   # 25 min to 1 h per layout; what was run at 1M is below", ""]
    for result in results:
        lines += [_machine(result), ""]
        for size, figures in sorted(result.get("sizes", {}).items(), key=lambda kv: int(kv[0])):
            layouts = [name for name in ("single", "partitioned") if name in figures]
            lines += [f"{int(size):,} chunks over {figures.get('sources')} sources (runs of ten documents per source, "
                      "so each holds every access group), one load moved between the layouts by the migration. p50 / "
                      "p95 in ms of `KnowledgeBase.search` (k = 10), the question embedded in the call; *10%*: the "
                      "asker may see 10% of the documents; *one source*: the search limited to one of the ten "
                      "(`SearchFilters.sources`, as a channel's sources or `--source`). Recall@10 against exact search "
                      "(within that source for the one-source rows).", "",
                      "| | " + " | ".join(layouts) + " |", "|---|" + "---|" * len(layouts)]

            def row(label: str, get, layouts=layouts, figures=figures) -> str:  # type: ignore[no-untyped-def]
                return f"| {label} | " + " | ".join(str(get(figures[name])) for name in layouts) + " |"

            def latency(key: str):  # type: ignore[no-untyped-def]
                return lambda f: "{p50} / {p95}".format(**f["latency_ms"][key]) if key in f["latency_ms"] else "–"

            lines += [
                row("hybrid, every source", latency("hybrid")),
                row("hybrid, every source, 10%", latency("hybrid_filtered")),
                row("hybrid, one source", latency("hybrid_one_source")),
                row("hybrid, one source, 10%", latency("hybrid_one_source_filtered")),
                row("dense, every source (cached question)", latency("dense_cached_query")),
                row("lexical, every source", latency("lexical")),
                row("bare HNSW top-10 floor (raw SQL)", latency("raw_sql")),
                row("HNSW recall@10 (10%)", lambda f: f"{f['hnsw_recall@10']} ({f['hnsw_filtered_recall@10']})"),
                row("HNSW recall@10 one source (10%)", lambda f: (
                    f"{f['one_source']['hnsw_recall@10']} ({f['one_source']['hnsw_filtered_recall@10']})")),
                row("lexical recall@10 (one source)", lambda f: (
                    f"{f['lexical_recall@10']} ({f['one_source']['lexical_recall@10']})")),
                row("chunks: heap + TOAST + indexes (MB)", lambda f: f["chunks_table_mb"]),
                row("HNSW graph(s) (MB)", lambda f: next((v for k, v in f["index_mb"].items() if "hnsw" in k), "–")),
                row("moved into this layout by the migration (s)", lambda f: f.get("migrate_s") or "(loaded)"),
                row("load average at start", lambda f: f.get("load_average_at_start")),
                "",
            ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parts = [HEADER]
    search = _load("search")
    parts.append(targets_section({"search": search, "ingest": _load("ingest"), "bot": _load("bot")}))
    if search:
        parts.append(search_section(search))
    if search and any("levers" in figures for figures in search.get("sizes", {}).values()):
        parts.append(levers_section(search))
    ingest = _load("ingest")
    if ingest:
        parts.append(ingest_section(ingest))
    bot = _load("bot")
    if bot:
        parts.append(bot_section(bot))
    platforms = _load("bot_platforms")
    if platforms:
        parts.append(bot_platforms_section(platforms))
    if _load("scale") or _load("sync_workers"):
        parts.append(scale_section(_load("scale"), _load("sync_workers")))
    partitions = [r for r in (_load("partitions"), _load("partitions-1m")) if r]
    if partitions:
        parts.append(partitions_section(partitions))
    notes = HERE / "NOTES.md"
    if notes.exists():
        parts.append(notes.read_text())
    text = "\n".join(parts)
    if OUT.exists():
        text = with_kept(text, kept_blocks(OUT.read_text()))
    OUT.write_text(text)
    print(f"wrote {OUT}")


# Hand-written text inside a rendered section (a figure no results file holds, a reading of the figures) survives a
# re-render when it sits between these two lines: it is put back at the end of the section with the same heading.
KEPT_START, KEPT_END = "<!-- kept -->", "<!-- /kept -->"


def kept_blocks(text: str) -> list[tuple[str, str]]:
    """The kept blocks of a rendered file, markers included, each with the heading (`## …`, `### …`) it is under."""
    blocks: list[tuple[str, str]] = []
    heading, block = "", None
    for line in text.splitlines():
        if block is not None:
            block.append(line)
            if line.strip() == KEPT_END:
                blocks.append((heading, "\n".join(block)))
                block = None
        elif line.strip() == KEPT_START:
            block = [line]
        elif line.startswith("#"):
            heading = line.strip()
    return blocks


def with_kept(text: str, blocks: list[tuple[str, str]]) -> str:
    """`text` with each kept block at the end of its heading's section (before the next heading); a block whose
    heading is no longer rendered goes at the end of the file, so that nothing written by hand is lost."""
    lines = text.splitlines()
    orphans: list[str] = []
    for heading, block in blocks:
        if block in text:
            continue  # rendered already (a results file's own note)
        starts = [i for i, line in enumerate(lines) if line.strip() == heading]
        if not starts:
            orphans += [heading, "", block, ""]
            continue
        end = next((i for i in range(starts[0] + 1, len(lines)) if lines[i].startswith("#")), len(lines))
        while end > starts[0] + 1 and not lines[end - 1].strip():
            end -= 1
        lines[end:end] = ["", *block.splitlines()]
    return "\n".join(lines + ([""] + orphans if orphans else [])) + "\n"


if __name__ == "__main__":
    main()
