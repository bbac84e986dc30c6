"""The view's HTML pages, rendered on the server: plain markup, one local stylesheet, inline SVG
charts, no script. Every value from a run is escaped."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from stacx.infra.view.chart import Line, line_chart
from stacx.infra.view.curves import SUCCESS_REWARD, TrainerStep, VersionRow, throughput, tokens_per_s
from stacx.infra.view.reader import Fetched, TrajectorySummary
from stacx.infra.view.runs import RunEntry
from stacx.infra.view.tokens import turn_spans

__all__ = [
    "STYLESHEET",
    "TrajectoryFilter",
    "html_page",
    "newest_first",
    "run_list_page",
    "run_page",
    "trajectories_page",
    "trajectory_page",
]

STYLESHEET = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.2em 2em; color: #222; }
a { color: #0b5cad; }
h1 { font-size: 1.4em; }
h2 { font-size: 1.15em; margin-top: 1.4em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { padding: 3px 10px; border-bottom: 1px solid #ddd; }
th { text-align: left; background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #777; }
.error { color: #b00020; }
.nav { margin-bottom: 1em; }
.status-running { color: #0a7d27; font-weight: 600; }
.status-failed { color: #b00020; font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure.chart { border: 1px solid #e3e3e3; background: #fff; margin: 0; }
figure.chart svg { display: block; }
form.filter label { margin-right: 10px; }
form.filter input { width: 7em; }
.turn { border: 1px solid #ddd; border-radius: 6px; margin: 10px 0; padding: 6px 10px; }
.turn .role { font-weight: 600; }
.turn pre { white-space: pre-wrap; margin: 4px 0; }
.turn.context { background: #fafafa; }
.tokens { font: 12px/1.9 ui-monospace, monospace; word-break: break-all; }
.tok { white-space: pre-wrap; border-radius: 2px; padding: 0 1px; margin: 0 1px 0 0; }
.tok.trained { background: #c6efc2; }
.tok.masked { background: #ececec; color: #666; }
.legend-box { display: inline-block; padding: 0 6px; border-radius: 3px; }
.exit-ok { color: #0a7d27; }
.exit-fail { color: #b00020; }
"""

_REFRESH_S = 5


def html_page(title: str, body: str, *, live: bool) -> str:
    """A whole page: the run list link, `body`, and with `live` a reload every few seconds."""
    refresh = f'<meta http-equiv="refresh" content="{_REFRESH_S}">' if live else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} · stacx view</title>{refresh}"
        '<link rel="stylesheet" href="/static/view.css"></head><body>'
        f'<div class="nav"><a href="/">runs</a></div>{body}'
        + (f'<p class="muted" id="live">live: this page refreshes every {_REFRESH_S} s</p>' if live else "")
        + "</body></html>"
    )


def _when(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if epoch_s else "-"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _run_url(run: RunEntry) -> str:
    return f"/runs/{quote(run.run_id, safe='')}"


def _status(status: str) -> str:
    return f'<span class="status-{escape(status.replace(" ", "-"))}">{escape(status)}</span>'


# --------------------------------------------------------------------------------- run list


def run_list_page(runs: Sequence[RunEntry], *, runs_dir: str, broker_error: str | None) -> str:
    rows = "".join(
        f'<tr class="run" data-run-id="{escape(r.run_id)}">'
        f'<td><a href="{_run_url(r)}">{escape(r.run_id)}</a></td>'
        f"<td>{escape(r.name)}</td><td>{_status(r.status)}</td>"
        f'<td class="num">{escape(str((r.report or {}).get("policy_versions", "-")))}</td>'
        f"<td>{_when(r.updated)}</td>"
        f"<td><code>{escape(r.trajectories_topic or '(warm start)')}</code></td></tr>"
        for r in runs
    )
    error = f'<p class="error" id="broker-error">{escape(broker_error)}</p>' if broker_error else ""
    table = (
        '<table id="runs"><tr><th>run</th><th>name</th><th>status</th><th>policy versions</th>'
        f"<th>updated</th><th>trajectories topic</th></tr>{rows}</table>"
        if runs
        else f'<p class="muted">no runs in {escape(runs_dir)} and no run topics on the broker</p>'
    )
    body = f'<h1>Runs</h1><p class="muted">from {escape(runs_dir)} and the broker</p>{error}{table}'
    return html_page("runs", body, live=any(r.live for r in runs))


# ------------------------------------------------------------------------------------- run


def _status_table(
    run: RunEntry,
    summaries: Sequence[TrajectorySummary],
    newest_version: int | None,
    stage: str | None,
    reader_error: str | None,
    undecodable: int,
) -> str:
    report = run.report or {}
    rows: list[tuple[str, str]] = [
        ("status", _status(run.status)),
        ("stage", escape(stage or str(report.get("stage") or "-"))),
        ("newest policy version", escape(str(newest_version if newest_version is not None else "-"))),
        ("trajectories", f'<span id="num-trajectories">{len(summaries)}</span>'),
        ("trajectories topic", f"<code>{escape(run.trajectories_topic or '(warm start)')}</code>"),
        ("run folder", escape(str(run.root)) if run.root else "-"),
    ]
    if report:
        rows += [
            (
                "held-out success",
                f"{_num(report.get('success_before'))} → {_num(report.get('success_after'))}",
            ),
            ("wall time", f"{_num(report.get('wall_s'), 4)} s"),
        ]
        if report.get("error"):
            rows.append(("error", f'<span class="error">{escape(str(report["error"]))}</span>'))
    if undecodable:
        rows.append(("undecodable events", str(undecodable)))
    if reader_error:
        rows.append(("topics", f'<span class="error">{escape(reader_error)}</span>'))
    return '<table id="status">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _charts(
    rows: Sequence[VersionRow],
    summaries: Sequence[TrajectorySummary],
    steps: Sequence[TrainerStep],
    report: dict[str, Any],
) -> str:
    heldout = [(float(e["version"]), float(e["success"])) for e in report.get("heldout_curve") or []]
    rl_steps = [s for s in steps if not s.sft]
    sft_steps = [s for s in steps if s.sft]
    warm_start = [(s.step, s.loss) for s in sft_steps] or _report_sft_loss(report)
    charts = [
        line_chart(
            "reward and success per policy version",
            [
                Line("mean reward", [(r.version, r.mean_reward) for r in rows]),
                Line(f"success (reward ≥ {SUCCESS_REWARD:g})", [(r.version, r.success) for r in rows]),
                Line("tool-use rate", [(r.version, r.tool_rate) for r in rows]),
                Line("held-out success", heldout),
            ],
            x_label="policy version",
            y_label="rate / reward",
            chart_id="chart-reward",
        ),
        line_chart(
            "staleness",
            [Line("mean staleness", [(r.version, r.mean_staleness) for r in rows])],
            x_label="policy version",
            y_label="versions behind",
            chart_id="chart-staleness",
        ),
        line_chart(
            "throughput",
            [Line("trajectories/s", throughput(summaries))],
            x_label="seconds since the first trajectory",
            y_label="trajectories/s",
            chart_id="chart-throughput",
        ),
        line_chart(
            "trainer loss",
            [
                Line("RL loss", [(s.step, s.loss) for s in rl_steps]),
                Line("warm-start loss", warm_start),
            ],
            x_label="trainer step",
            y_label="loss",
            chart_id="chart-loss",
        ),
        line_chart(
            "trainer tokens/s",
            [Line("tokens/s", tokens_per_s(rl_steps)), Line("warm-start tokens/s", tokens_per_s(sft_steps))],
            x_label="trainer step",
            y_label="tokens/s",
            chart_id="chart-tokens",
        ),
    ]
    return '<div class="charts">' + "".join(charts) + "</div>"


def _report_sft_loss(report: dict[str, Any]) -> list[tuple[float, float]]:
    """The warm start's loss curve of `report.json` (`sft_loss`: [step, loss] pairs), for runs whose
    logs do not hold the warm start's step lines."""
    points = []
    for pair in report.get("sft_loss") or []:
        try:
            step, loss = pair
            points.append((float(step), float(loss)))
        except (TypeError, ValueError):  # a hand-edited report: leave the point out
            continue
    return points


def _version_table(rows: Sequence[VersionRow]) -> str:
    head = (
        "<tr><th>version</th><th>episodes</th><th>mean reward</th><th>reward std</th>"
        "<th>success</th><th>tool use</th><th>staleness</th><th>tokens</th></tr>"
    )
    body = "".join(
        f'<tr><td class="num">{r.version}</td><td class="num">{r.episodes}</td>'
        f'<td class="num">{r.mean_reward:.3f}</td><td class="num">{r.reward_std:.3f}</td>'
        f'<td class="num">{r.success:.3f}</td><td class="num">{r.tool_rate:.3f}</td>'
        f'<td class="num">{r.mean_staleness:.2f}</td><td class="num">{r.mean_tokens:.0f}</td></tr>'
        for r in rows
    )
    return f'<table id="versions">{head}{body}</table>'


def run_page(
    run: RunEntry,
    *,
    summaries: Sequence[TrajectorySummary],
    rows: Sequence[VersionRow],
    steps: Sequence[TrainerStep],
    newest_version: int | None,
    stage: str | None,
    reader_error: str | None,
    undecodable: int,
) -> str:
    body = (
        f"<h1>{escape(run.run_id)}</h1>"
        f'<p><a id="trajectories-link" href="{_run_url(run)}/trajectories">'
        f"trajectories ({len(summaries)})</a></p>"
        + _status_table(run, summaries, newest_version, stage, reader_error, undecodable)
        + "<h2>Curves</h2>"
        + _charts(rows, summaries, steps, run.report or {})
        + "<h2>Per policy version</h2>"
        + _version_table(rows)
    )
    return html_page(run.run_id, body, live=run.live)


# ------------------------------------------------------------------------------ trajectories


@dataclass(frozen=True, slots=True)
class TrajectoryFilter:
    """What the trajectory browser shows (unset: anything)."""

    task: str = ""
    """Part of the task id or the task type."""
    min_reward: float | None = None
    max_reward: float | None = None
    version: int | None = None
    status: str = ""
    limit: int = 200
    """Rows per page."""
    start: int = 0
    """How many of the newest matches come before this page."""

    def keeps(self, s: TrajectorySummary) -> bool:
        needle = self.task.strip().lower()
        return (
            (not needle or needle in s.task_id.lower() or needle in s.task_type.lower())
            and (self.min_reward is None or s.reward >= self.min_reward)
            and (self.max_reward is None or s.reward <= self.max_reward)
            and (self.version is None or s.policy_version == self.version)
            and (not self.status or s.status == self.status)
        )

    def query(self) -> dict[str, str]:
        values = {
            "task": self.task,
            "min_reward": self.min_reward,
            "max_reward": self.max_reward,
            "version": self.version,
            "status": self.status,
        }
        return {k: str(v) for k, v in values.items() if v not in (None, "")}

    def page_url(self, base: str, start: int) -> str:
        """This filter's page that begins `start` matches after the newest."""
        return f"{base}?{urlencode({**self.query(), 'limit': self.limit, 'start': max(0, start)})}"


def newest_first(summaries: Sequence[TrajectorySummary]) -> list[TrajectorySummary]:
    """By event time, newest first (partitions are read in no set order)."""
    return sorted(summaries, key=lambda s: (s.timestamp_ms, s.partition, s.offset), reverse=True)


def _filter_form(f: TrajectoryFilter, statuses: Sequence[str]) -> str:
    def field(name: str, label: str, value: object) -> str:
        shown = "" if value is None else escape(str(value))
        return f'<label>{label} <input name="{name}" id="f-{name}" value="{shown}"></label>'

    options = "".join(
        f'<option value="{escape(s)}"{" selected" if s == f.status else ""}>{escape(s or "any")}</option>'
        for s in ["", *statuses]
    )
    return (
        '<form class="filter" method="get" id="filter">'
        + field("task", "task", f.task)
        + field("min_reward", "reward ≥", f.min_reward)
        + field("max_reward", "reward ≤", f.max_reward)
        + field("version", "policy version", f.version)
        + f'<label>status <select name="status" id="f-status">{options}</select></label>'
        + f'<input type="hidden" name="limit" value="{f.limit}">'
        + '<button type="submit" id="apply">filter</button></form>'
    )


def trajectories_page(run: RunEntry, summaries: Sequence[TrajectorySummary], f: TrajectoryFilter) -> str:
    kept = newest_first([s for s in summaries if f.keeps(s)])
    shown = kept[f.start : f.start + f.limit]
    base = _run_url(run)
    rows = "".join(
        f'<tr class="trajectory" data-reward="{s.reward}" data-version="{s.policy_version}">'
        f'<td><a href="{base}/trajectories/{s.partition}/{s.offset}">{escape(s.trajectory_id[:12])}</a></td>'
        f"<td>{escape(s.task_id)}</td><td>{escape(s.task_type)}</td>"
        f'<td class="num">{s.policy_version}</td><td class="num">{s.reward:.3f}</td>'
        f"<td>{escape(s.status)}</td>"
        f'<td class="num">{s.num_turns}</td><td class="num">{s.num_tool_calls}</td>'
        f'<td class="num">{s.num_trained} / {s.num_tokens}</td></tr>'
        for s in shown
    )
    table = (
        '<table id="trajectories"><tr><th>trajectory</th><th>task</th><th>task type</th><th>version</th>'
        "<th>reward</th><th>status</th><th>turns</th><th>tool calls</th><th>trained / tokens</th></tr>"
        f"{rows}</table>"
    )
    statuses = sorted({s.status for s in summaries})
    count = (
        f'<p id="count">{len(kept)} of {len(summaries)} trajectories match'
        + (f"; newest first, {f.start + 1} to {f.start + len(shown)} shown" if shown else "")
        + "</p>"
    )
    body = (
        f'<h1>Trajectories of <a href="{base}">{escape(run.run_id)}</a></h1>'
        + _filter_form(f, statuses)
        + count
        + _pager(f, f"{base}/trajectories", len(kept), live=run.live)
        + table
    )
    # never reloads itself: a filter being typed would be wiped (a live run gets a reload link)
    return html_page(f"trajectories of {run.run_id}", body, live=False)


def _pager(f: TrajectoryFilter, base: str, num_kept: int, *, live: bool) -> str:
    links = []
    if f.start > 0:
        links.append(f'<a id="newer" href="{escape(f.page_url(base, f.start - f.limit))}">← newer</a>')
    if f.start + f.limit < num_kept:
        links.append(f'<a id="older" href="{escape(f.page_url(base, f.start + f.limit))}">older →</a>')
    if live:
        again = escape(f.page_url(base, f.start))
        links.append(f'<a id="reload" href="{again}">reload (the run is live)</a>')
    return f'<p class="pager">{" · ".join(links)}</p>' if links else ""


# -------------------------------------------------------------------------------- trajectory


def _token_html(fetched: Fetched, start: int, end: int, decode: Callable[[int], str] | None) -> str:
    t = fetched.trajectory
    out = []
    for pos in range(start, end):
        token = int(t.token_ids[pos])
        trained = bool(t.loss_mask[pos]) if pos < len(t.loss_mask) else False
        text = decode(token) if decode is not None else f"[{token}]"
        lp = f" · logprob {float(t.logprobs[pos]):.3f}" if trained and pos < len(t.logprobs) else ""
        cls = "trained" if trained else "masked"
        out.append(f'<span class="tok {cls}" title="#{pos} id {token}{lp}">{escape(text)}</span>')
    return '<div class="tokens">' + "".join(out) + "</div>"


def _turn_body(turn: Any, exit_code: str | None) -> str:
    parts = [f"<pre>{escape(turn.text)}</pre>"] if turn.text else []
    for call in turn.tool_calls:
        parts.append(
            f'<div class="tool-call">tool call <b>{escape(call.name)}</b> '
            f"<code>{escape(call.arguments)}</code></div>"
        )
    if exit_code is not None:
        cls = "exit-ok" if exit_code == "0" else "exit-fail"
        parts.append(
            f'<div class="exit-code">sandbox exit code <span class="{cls}">{escape(exit_code)}</span></div>'
        )
    if turn.policy_version is not None:
        parts.append(f'<div class="muted">generated by policy version {turn.policy_version}</div>')
    return "".join(parts)


def _turns_html(fetched: Fetched, decode: Callable[[int], str] | None) -> str:
    t = fetched.trajectory
    spans = turn_spans(t)
    by_turn = {s.turn: s for s in spans if s.turn is not None}
    codes = [c for c in t.metadata.get("exit_codes", "").split(",") if c]
    tool_turns = [i for i, turn in enumerate(t.turns) if turn.role == "tool"]
    exit_by_turn = dict(zip(tool_turns, codes, strict=False))
    out, emitted = [], 0

    def context_until(end: int) -> None:
        nonlocal emitted
        for s in spans:
            if s.turn is None and s.start >= emitted and s.end <= end:
                out.append(
                    '<div class="turn context"><span class="role muted">prompt / template tokens</span>'
                    + _token_html(fetched, s.start, s.end, decode)
                    + "</div>"
                )
                emitted = s.end

    for index, turn in enumerate(t.turns):
        span = by_turn.get(index)
        if span is not None:
            context_until(span.start)
        tokens = (
            _token_html(fetched, span.start, span.end, decode)
            if span is not None
            else '<div class="muted">tokens not found in order in the sequence (shown around)</div>'
        )
        out.append(
            f'<div class="turn" data-turn="{index}"><span class="role">{escape(turn.role)}</span> '
            f'<span class="muted">turn {index}</span>'
            f"{_turn_body(turn, exit_by_turn.get(index))}{tokens}</div>"
        )
        if span is not None:
            emitted = span.end
    context_until(len(t.token_ids))
    return "".join(out)


def trajectory_page(run: RunEntry, fetched: Fetched, *, decode: Callable[[int], str] | None) -> str:
    t = fetched.trajectory
    trained = int(t.loss_mask.sum()) if len(t.loss_mask) else 0
    trace = (
        f'<a id="trace-link" href="/traces/{escape(fetched.trace_id)}">'
        f"trace {escape(fetched.trace_id)}</a> (the episode, and the step that trained it)"
        if fetched.trace_id
        else '<span class="muted">no trace context</span>'
    )
    facts = [
        ("trajectory", escape(t.trajectory_id)),
        ("task", f"{escape(t.task_id)} ({escape(t.task_type)})"),
        ("group / sample", f"{escape(t.group_id)} / {t.sample_index}"),
        ("policy version", str(t.policy_version)),
        ("status", escape(str(t.status))),
        ("reward", f'<span id="reward">{t.reward:.4g}</span>'),
        (
            "tokens",
            f'<span id="num-trained">{trained}</span> trained of '
            f'<span id="num-tokens">{len(t.token_ids)}</span>',
        ),
        ("trace", trace),
        ("event", f"partition {fetched.partition}, offset {fetched.offset}"),
    ]
    if t.error:
        facts.append(("error", f'<span class="error">{escape(t.error)}</span>'))
    rewards = "".join(
        f'<tr><td>{escape(k)}</td><td class="num">{v:.4g}</td></tr>' for k, v in sorted(t.rewards.items())
    )
    metadata = "".join(
        f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in sorted(t.metadata.items())
    )
    back = f"{_run_url(run)}/trajectories"
    body = (
        f'<h1>Trajectory {escape(t.trajectory_id[:12])} of <a href="{back}">{escape(run.run_id)}</a></h1>'
        + '<table id="facts">'
        + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
        + "</table>"
        + f'<h2>Reward components</h2><table id="rewards">{rewards}</table>'
        + f'<h2>Metadata</h2><table id="metadata">{metadata}</table>'
        + '<h2>Turns</h2><p><span class="legend-box tok trained">trained (loss mask 1)</span> '
        + '<span class="legend-box tok masked">masked (loss mask 0)</span></p>'
        + _turns_html(fetched, decode)
    )
    return html_page(f"trajectory {t.trajectory_id[:12]}", body, live=False)
