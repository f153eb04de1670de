"""The admin page: `GET /admin` on `ragbot run`'s HTTP server, served only when ADMIN_TOKEN is set (404 otherwise).

- Access: `Authorization: Bearer <ADMIN_TOKEN>` (scripts, a reverse proxy that adds it) or `/admin?token=<ADMIN_TOKEN>`
  (a browser). Compared in constant time (hmac.compare_digest); a missing or wrong token gets 401. The page asks
  browsers not to cache it or send it as a referrer (the query token would otherwise leak into logs of other sites).
- Read-only: GET only, no forms, no state change, so there is nothing for a cross-site request to forge.
- Server-rendered HTML (every value escaped) with inline SVG charts: no JavaScript at all (the Content-Security-Policy
  forbids scripts). No secrets are rendered: sources show their kind and location, never their configuration.

Sections: sources with their last run and error, the sync history, questions per day and answer rate (SVG), gaps
by topic (bot.chat.insights, as an operator sees them: a private conversation's questions without the asker),
recent feedback, and the audit log of access changes (identity mappings, channel grants).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from html import escape
from typing import TYPE_CHECKING

from aiohttp import web

from bot.chat.insights import InsightsReport, Viewer, build_report
from bot.platforms import display_names

if TYPE_CHECKING:
    from bot.chat.state import BotState, DailyCounts
    from knowledge import KnowledgeBase, SyncRun

logger = logging.getLogger(__name__)

PATH = "/admin"
DAYS = 30
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


def token_matches(request: web.Request, token: str) -> bool:
    """Bearer header or ?token=, compared in constant time."""
    offered = ""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        offered = header[7:].strip()
    elif "token" in request.query:
        offered = request.query.get("token", "")
    return hmac.compare_digest(offered.encode("utf-8"), token.encode("utf-8"))


def admin_routes(kb: KnowledgeBase, state: BotState, token: str) -> list[web.RouteDef]:
    if not token:
        return []

    async def page(request: web.Request) -> web.Response:
        if not token_matches(request, token):
            return web.Response(status=401, text="401: a valid ADMIN_TOKEN is required (Authorization: Bearer …).",
                                headers={**HEADERS, "WWW-Authenticate": 'Bearer realm="ragbot admin"'})
        html = await render_page(kb, state)
        return web.Response(text=html, content_type="text/html", charset="utf-8", headers=HEADERS)

    return [web.get(PATH, page, allow_head=False)]


# Rendering.


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment else "—"


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]], empty: str) -> str:
    body = "".join("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="empty">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _days(daily: Sequence[DailyCounts], until: date, days: int = DAYS) -> list[tuple[date, int, int]]:
    by_day = {d.day: d for d in daily}
    out = []
    for offset in range(days - 1, -1, -1):
        day = until - timedelta(days=offset)
        counts = by_day.get(day)
        out.append((day, counts.questions if counts else 0, counts.answered if counts else 0))
    return out


def bar_chart(series: Sequence[tuple[date, float]], *, title: str, chart_id: str, unit: str = "",
              maximum: float | None = None, width: int = 600, height: int = 160) -> str:
    """An SVG bar chart (one bar a day), labelled for screen readers."""
    top = maximum if maximum is not None else max([v for _, v in series] + [1])
    pad_left, pad_bottom = 36, 20
    inner_w, inner_h = width - pad_left - 4, height - pad_bottom - 8
    bar_w = inner_w / max(1, len(series))
    bars = []
    for i, (day, value) in enumerate(series):
        h = 0 if top == 0 else inner_h * value / top
        x = pad_left + i * bar_w
        y = 8 + inner_h - h
        bars.append(f'<rect class="bar" x="{x + 1:.1f}" y="{y:.1f}" width="{max(1.0, bar_w - 2):.1f}" '
                    f'height="{h:.1f}"><title>{_e(day.isoformat())}: {_e(f"{value:g}{unit}")}</title></rect>')
    first, last = (series[0][0].strftime("%m-%d"), series[-1][0].strftime("%m-%d")) if series else ("", "")
    return (
        f'<svg id="{_e(chart_id)}" class="chart" role="img" aria-label="{_e(title)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{_e(title)}</title>"
        f'<line x1="{pad_left}" y1="{8 + inner_h}" x2="{width - 4}" y2="{8 + inner_h}" class="axis"/>'
        f'<text x="{pad_left - 4}" y="14" text-anchor="end" class="label">{_e(f"{top:g}{unit}")}</text>'
        f'<text x="{pad_left - 4}" y="{8 + inner_h}" text-anchor="end" class="label">0</text>'
        f'<text x="{pad_left}" y="{height - 4}" class="label">{_e(first)}</text>'
        f'<text x="{width - 4}" y="{height - 4}" text-anchor="end" class="label">{_e(last)}</text>'
        + "".join(bars) + "</svg>"
    )


def charts(report: InsightsReport) -> str:
    days = _days(report.daily, report.until.date())
    per_day = bar_chart([(d, q) for d, q, _ in days], title=f"Questions per day, last {DAYS} days",
                        chart_id="questions-per-day")
    rate = bar_chart([(d, round(100 * a / q) if q else 0) for d, q, a in days],
                     title=f"Answer rate per day (% of questions answered), last {DAYS} days",
                     chart_id="answer-rate", unit="%", maximum=100)
    total_q = sum(q for _, q, _ in days)
    total_a = sum(a for _, _, a in days)
    summary = (f"{total_q} questions, {total_a} answered ({round(100 * total_a / total_q) if total_q else 0}%); "
               f"feedback: {report.feedback.get('up', 0)} up, {report.feedback.get('down', 0)} down")
    return (f"<p>{_e(summary)}</p><h3>Questions per day</h3>{per_day}"
            f"<h3>Answer rate</h3>{rate}")


def gaps_section(report: InsightsReport) -> str:
    if not report.topics:
        return '<p class="empty">No gaps: nothing declined, uncertain or rated down in the period.</p>'
    parts = []
    for topic in report.topics[:30]:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(topic.outcomes.items()))
        docs = "; ".join(f"{d.title} ({d.source})" for d in topic.closest_documents) or "nothing close"
        questions = "".join(
            f"<li>{_e(q.text)} <span class=\"meta\">{_e(_when(q.asked_at))} · {_e(q.where)}"
            f"{' · ' + _e(q.asker) if q.asker else ''} · {_e(q.outcome)}"
            f"{' · rated down' if q.downvotes else ''}{'' if q.posted else ' · auto, not posted'}</span></li>"
            for q in topic.questions[:10]
        )
        parts.append(
            f'<details class="gap"><summary><b>{topic.count}×</b> {_e(topic.name)} '
            f'<span class="meta">last {_e(_when(topic.last_asked))} · {_e(", ".join(topic.channels))} · '
            f"{_e(outcomes)}{' · rated down ' + str(topic.downvotes) if topic.downvotes else ''}</span></summary>"
            f"<p>Closest documents: {_e(docs)}</p><ul>{questions}</ul></details>"
        )
    return "".join(parts)


def documents_section(report: InsightsReport) -> str:
    most = _table(["document", "source", "citations", "updated"],
                  [(d.title, d.source, n, _when(d.updated_at)) for d, n in report.most_cited], "Nothing cited yet.")
    stale = _table(["document", "source", "citations", "updated"],
                   [(d.title, d.source, n, _when(d.updated_at)) for d, n in report.stale_cited],
                   "No cited document is more than a year old.")
    never = _table(["document", "source", "updated"], [(d.title, d.source, _when(d.updated_at))
                                                      for d in report.never_cited[:20]], "Every document was cited.")
    return (f"<h3>Most cited</h3>{most}<h3>Cited but not updated in a year</h3>{stale}"
            f"<h3>Never cited in the period ({report.never_cited_total})</h3>{never}")


# Where the questions on this page come from, said on the page: an operator who tried the bot in the terminal
# before setting up a chat platform would otherwise wonder why nothing shows (issue 41).
def counted_from() -> str:
    return (f"Questions are counted from {', '.join(display_names())} and the terminal (`ragbot chat`, "
            "`ragbot ask`, recorded as platform terminal, asked by terminal:<login name>).")

# The sync history's columns, each count named (not "+0 ~0 -0 =0 !1").
SYNC_COLUMNS = ["source", "trigger", "status", "started", "finished", "added", "updated", "deleted", "unchanged",
                "failed", "error"]


def sync_history_rows(runs: Sequence[SyncRun]) -> list[tuple[object, ...]]:
    """One row per run. A run that finished with files it could not index says so in its status ("ok, 1 failed"),
    and its error names them (knowledge.ingest.runs.failed_files_line)."""
    rows: list[tuple[object, ...]] = []
    for r in runs:
        status = f"{r.status}, {r.failed} failed" if r.failed and r.status == "ok" else r.status
        rows.append((r.source, r.trigger, status, _when(r.started_at), _when(r.finished_at), r.added, r.updated,
                     r.deleted, r.unchanged, r.failed, r.error or ""))
    return rows


STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;max-width:1100px;color:#222}
h1{margin-bottom:.2rem} h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;width:100%;font-size:.9rem} th,td{border:1px solid #ddd;padding:.3rem .5rem;
text-align:left;vertical-align:top} th{background:#f4f4f4}
.chart .bar{fill:#4a7bd0} .chart .axis{stroke:#999} .chart .label{font-size:10px;fill:#555}
.meta{color:#666;font-size:.85rem} .empty{color:#666;font-style:italic} .failed{color:#b00020}
details.gap{margin:.4rem 0} nav a{margin-right:1rem}
"""


async def render_page(kb: KnowledgeBase, state: BotState, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    sources = await kb.list_sources()
    runs = await kb.sync_runs(None, 50)
    report = await build_report(kb, state, timedelta(days=DAYS), Viewer(), now=now)
    feedback = await state.recent_feedback(30)
    audit = await state.audit_entries(50)
    source_rows = []
    for s in sources:
        run = s.last_run
        source_rows.append((s.name, s.kind, s.location or "", s.documents,
                            "syncing now" if s.running else (run.status if run else "never synced"),
                            _when(run.finished_at or run.started_at) if run else "—",
                            (run.error or "") if run else ""))
    feedback_rows = [(_when(f.created_at), f.rating, f.platform, f.question)
                     for f in feedback]
    audit_rows = [(_when(a.at), a.actor, a.actor_role, a.action, a.subject, a.principal or "", a.outcome)
                  for a in audit]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ragbot admin</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><meta name="referrer" content="no-referrer">
<style>{STYLE}</style></head>
<body>
<h1>ragbot admin</h1>
<p class="meta">Read-only. Generated {_e(_when(now))} UTC; activity over the last {DAYS} days.</p>
<nav><a href="#activity">Activity</a><a href="#sources">Sources</a><a href="#syncs">Sync history</a>
<a href="#gaps">Gaps</a><a href="#documents">Documents</a><a href="#feedback">Feedback</a><a href="#audit">Audit log</a></nav>
<section id="activity"><h2>Activity</h2><p class="meta">{_e(counted_from())}</p>{charts(report)}</section>
<section id="sources"><h2>Sources</h2>
{_table(["name", "kind", "location", "documents", "last run", "when", "error"], source_rows, "No sources yet.")}
</section>
<section id="syncs"><h2>Sync history</h2>
{_table(SYNC_COLUMNS, sync_history_rows(runs), "No syncs yet.")}
</section>
<section id="gaps"><h2>Gaps</h2><p class="meta">Questions declined, answered as uncertain or rated down, grouped by
topic. Questions from private conversations are shown without the asker.</p>{gaps_section(report)}</section>
<section id="documents"><h2>Documents</h2>{documents_section(report)}</section>
<section id="feedback"><h2>Feedback</h2>
{_table(["when", "rating", "platform", "question"], feedback_rows, "No feedback yet.")}</section>
<section id="audit"><h2>Audit log</h2><p class="meta">Who changed who may see what (identity mappings, channel
grants), newest first, refused attempts included (`ragbot audit` shows more).</p>
{_table(["when", "actor", "as", "action", "subject", "principal", "outcome"], audit_rows, "No access changes yet.")}
</section>
</body></html>"""
