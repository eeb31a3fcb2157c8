"""The run page as one HTML document: server-rendered tables and inline SVG charts (pure).

    html = page(board, miner=None, refresh_seconds=3.0)

No build step and no external file: a few lines of inline script re-fetch the page every
`refresh_seconds` and swap its body (keeping the scroll position); without script a
`<noscript>` meta refresh does the same. Everything from the network is escaped. Elements a
reader looks for carry ids: `current-round`, `time-left`, `loss-plot`, `bytes-plot`,
`leaderboard`, `submissions`, `nodes`, `chain-head`, `miner-history`.
"""

from __future__ import annotations

import re
from html import escape

from node.roles.catchup import ordinal
from node.roles.dashboard.board import Outcome, RunBoard
from node.roles.dashboard.svg import bar_chart, line_chart

KEY = re.compile(r"^[0-9a-f]{64}$")
BAR_ROUNDS = 24  # rounds in the bytes chart: three bars each stay readable
CUT = "..."  # how the validator marks a reason cut to the signed result's 100 characters
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.muted{color:#6b7385} .ok{color:#17803d} .bad{color:#b42318} code{font-size:12px}
.facts{display:flex;gap:14px;flex-wrap:wrap;margin:14px 0}
.fact{border:1px solid #d9dde6;border-radius:8px;padding:8px 14px;min-width:120px}
.fact b{display:block;font-size:20px}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eceef3}
th{font-weight:600;background:#f6f7f9} td.num{text-align:right;font-variant-numeric:tabular-nums}
.chart .axis{stroke:#8a91a3} .chart .grid{stroke:#eceef3} .chart .tick,.chart .label{font-size:11px;fill:#6b7385}
.chart .line{fill:none;stroke:#2f6fde;stroke-width:2} .chart .point{fill:#2f6fde}
.chart .s0{fill:#c9ced9} .chart .s1{fill:#2f6fde} .chart .s2{fill:#e08a1e}
.charts{display:flex;gap:24px;flex-wrap:wrap}
form{margin:8px 0} input{font:12px monospace;width:520px}
"""


def page(board: RunBoard, miner: str | None = None, refresh_seconds: float = 3.0) -> str:
    refresh_ms = int(refresh_seconds * 1000)
    script = (
        f"<script>setInterval(async()=>{{try{{const r=await fetch(location.href,{{cache:'no-store'}});"
        "if(r.ok){const d=new DOMParser().parseFromString(await r.text(),'text/html');"
        f"document.body.replaceWith(d.body);}}}}catch(e){{}}}},{refresh_ms});</script>"
    )
    head = (
        f'<meta charset="utf-8"><title>pulse: {escape(board.run.name)} round {board.current_round}</title>'
        f'<noscript><meta http-equiv="refresh" content="{max(1, round(refresh_seconds))}"></noscript>'
        f"<style>{STYLE}</style>{script}"
    )
    body = [_header(board), _charts(board), _leaderboard(board), _submissions(board)]
    if miner is not None:
        body.append(_miner(board, miner))
    body += [_nodes(board), _footnote()]
    return f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>"


def _header(board: RunBoard) -> str:
    run = board.run
    left = _time_left(board)
    chain = (
        '<span class="ok">linked</span>'
        if board.chain_ok
        else '<span class="bad">BROKEN: a round starts from another state than the one before ended</span>'
    )
    head = f"<code>{escape(board.head)}</code>" if board.head else "not seen yet"
    online = ", ".join(f"{n} {escape(role)}{'s' if n > 1 else ''}" for role, n in sorted(board.online().items()))
    return (
        f"<h1>pulse run <i>{escape(run.name)}</i></h1>"
        f'<div class="muted">run id <code>{escape(run.run_id)}</code>, task {escape(run.task)}</div>'
        '<div class="facts">'
        f'<div class="fact">open round<b id="current-round">{board.current_round}</b></div>'
        f'<div class="fact">time left<b id="time-left">{left}</b></div>'
        f'<div class="fact">rounds completed<b id="completed">{board.completed}</b></div>'
        f'<div class="fact">announced submissions<b id="announced">{board.announced}</b></div>'
        f'<div class="fact">nodes online<b id="online">{len(board.nodes)}</b>{online or "none"}</div>'
        "</div>"
        f'<div id="chain-head">hash chain head (W<sub>{board.current_round}</sub>): {head}; chain {chain}</div>'
    )


def _time_left(board: RunBoard) -> str:
    """Seconds to the open round's target; where its opening was not seen (rounds that close faster
    than the page reads), the pace rounds close at instead of "unknown"."""
    pace = f"rounds close every {board.pace:.1f} s" if board.pace is not None else None
    if board.time_left is None:
        return pace or "unknown"
    if board.time_left > 0:
        return f"{board.time_left:.1f} s" if board.time_left < 10 else f"{board.time_left:.0f} s"
    return "closing"


def _charts(board: RunBoard) -> str:
    if board.run.task == "rl":
        metric, points = "held-out reward", [(r.round, r.reward) for r in board.rounds if r.reward is not None]
    else:
        metric, points = "held-out loss (nats/token)", [(r.round, r.loss) for r in board.rounds if r.loss is not None]
    bars = [
        (
            r.round,
            {
                "dense FP32": r.dense_bytes or 0,
                "sent (compressed)": r.received_bytes or 0,
                "PULSESync patch": r.patch_bytes,
            },
        )
        for r in board.rounds[-BAR_ROUNDS:]  # readable bars: the last rounds only
    ]
    series = ["dense FP32", "sent (compressed)", "PULSESync patch"]
    return (
        '<div class="charts"><div>'
        f"<h2>{metric.capitalize()} after each round</h2>"
        f"{line_chart(points, element_id='loss-plot', y_label=metric)}"
        f"</div><div><h2>Bytes per round (the last {len(bars)})</h2>"
        f"{bar_chart(bars, series, element_id='bytes-plot')}"
        "</div></div>"
    )


def _leaderboard(board: RunBoard) -> str:
    rows = []
    for i, m in enumerate(board.leaderboard, start=1):
        rating = "-" if m.rating is None else f"{m.rating:.3f}"
        indicator = "-" if m.indicator is None else f"{m.indicator:+.2f}"
        rows.append(
            f'<tr><td class="num">{i}</td><td>{_key_link(m.key)}</td><td class="num">{rating}</td>'
            f'<td class="num">{indicator}</td><td class="num">{_score(m.last)}</td><td>{_fate(m.last)}</td>'
            f'<td class="num">{m.aggregated_rounds} of {m.submissions}</td></tr>'
        )
    head = (
        "<tr><th>#</th><th>miner</th><th>rating</th><th>indicator avg</th><th>last score</th>"
        "<th>last round</th><th>aggregated</th></tr>"
    )
    return _table("Leaderboard", "leaderboard", head, rows, "no round result yet")


def _submissions(board: RunBoard) -> str:
    title = "Every submission of the last rounds"
    return _outcomes(title, "submissions", board.recent, "none yet", with_miner=True)


def _miner(board: RunBoard, key: str) -> str:
    if not KEY.match(key):
        return '<h2>Miner</h2><p id="miner-history" class="bad">not a miner key (64 lowercase hex characters)</p>'
    history = list(reversed(board.history(key)))
    title = f"Miner {key[:16]}...: history"
    return _outcomes(title, "miner-history", history, "no submission seen from this key", with_miner=False)


def _outcomes(title: str, element_id: str, outcomes: list[Outcome], empty: str, *, with_miner: bool) -> str:
    """One row per submission: round, (miner,) outcome with its reason, score, payload."""
    columns = ["round", *(["miner"] if with_miner else []), "outcome", "score", "payload"]
    rows = [
        f'<tr><td class="num">{o.round}</td>'
        + (f"<td>{_key_link(o.sender)}</td>" if with_miner else "")
        + f'<td>{_fate(o)}</td><td class="num">{_score(o)}</td><td><code>{o.payload_sha256[:12]}</code></td></tr>'
        for o in outcomes
    ]
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    return _table(title, element_id, head, rows, empty)


def _nodes(board: RunBoard) -> str:
    rows = [
        f"<tr><td>{escape(n.role)}</td><td><code>{n.key[:16]}</code></td><td class='num'>{n.round}</td>"
        f"<td><code>{escape((n.state_hash or '-')[:12])}</code></td><td class='num'>{n.seconds_ago:.0f} s ago</td></tr>"
        for n in board.nodes
    ]
    head = "<tr><th>role</th><th>key</th><th>round</th><th>state</th><th>heartbeat</th></tr>"
    return _table("Nodes online (heartbeats of this round or the one before)", "nodes", head, rows, "none")


def _footnote() -> str:
    return (
        '<p class="muted">Outcomes, scores, reasons and the hash chain come from the validator\'s signed round '
        "results; held-out loss, bytes and ratings are its signed report beside them (not recomputable from the "
        "chain alone); heartbeats are each node's own claim. Records expire from the DHT after the run's record "
        "lifetime: this page keeps what it has seen since it started.</p>"
        '<form method="get"><input name="miner" placeholder="a miner key (64 hex) for its history">'
        "<button>history</button></form>"
    )


def _fate(o: Outcome) -> str:
    if o.aggregated:
        return f'<span class="ok">aggregated</span>, {ordinal(o.place or 0)} of {o.of}'
    return f'<span class="bad">not aggregated</span>: {_reason(o)}'


def _reason(o: Outcome) -> str:
    """The reason, wrapped by the table; one the signed result cut short ends at a whole word, and
    says where the rest is (`pulse receipt` recomputes that submission's figures)."""
    reason = o.reason or ""
    if not reason.endswith(CUT):
        return escape(reason)
    whole = reason[: -len(CUT)].rsplit(" ", 1)[0]
    more = f"the signed result keeps 100 characters; pulse receipt --round {o.round} --key <miner key> explains in full"
    return f'{escape(whole)} <abbr title="{escape(more)}">(more)</abbr>'


def _score(o: Outcome) -> str:
    return "-" if o.score is None else f"{o.score:.4g}"


def _key_link(key: str) -> str:
    return f'<a href="?miner={escape(key)}"><code>{escape(key[:16])}</code></a>'


def _table(title: str, element_id: str, head: str, rows: list[str], empty: str) -> str:
    if not rows:
        return f'<h2>{escape(title)}</h2><p class="muted" id="{element_id}">{escape(empty)}</p>'
    return f'<h2>{escape(title)}</h2><table id="{element_id}">{head}{"".join(rows)}</table>'
