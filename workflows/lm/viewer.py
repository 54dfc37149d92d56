"""A self-contained HTML view of rollout trees: which prefixes were expanded and why, and every leaf's reward."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

_CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;max-width:1200px}
.tree{border:1px solid #ccc;border-radius:6px;padding:.6em 1em;margin:1em 0}
.mixed{border-color:#2a7}
ul{list-style:none;padding-left:1.4em;border-left:1px dashed #bbb;margin:.2em 0}
.node{margin:.25em 0}
.turn{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px;background:#f7f7f7;padding:.3em;border-radius:4px;display:block}
.ok{color:#080;font-weight:600}.fail{color:#b00;font-weight:600}
.exp{background:#fff3c4;border-radius:3px;padding:0 .3em}
.meta{color:#666;font-size:12px}
"""


def _node(tree: dict[str, Any], nid: int, children: dict[int, list[int]]) -> str:
    n = tree["nodes"][nid]
    where = "root (the prompt)" if nid == 0 else f"depth {n['depth']} path {n['path']} · {n['status']}"
    bits = [f"<span class='meta'>#{nid} {where} · leaves below {n['leaves']}"]
    if n.get("target") is not None:
        bits.append(f" · V̂={n['target']:.2f}")
    bits.append("</span>")
    if "predicted" in n:
        p = n["predicted"]
        k = n.get("continuations", 0)
        bits.append(
            f" <span class='exp'>predicted p={p:.2f}; continuations K={k}</span>"
            if k
            else f" <span class='meta'>p={p:.2f}, not expanded</span>"
        )
    if n["reward"] is not None:
        cls, word = ("ok", "success") if n["reward"] > 0.5 else ("fail", "failure")
        bits.append(f" <span class='{cls}'>reward {n['reward']:g} ({word})</span>")
    body = f"<span class='turn'>{html.escape(n['content'])}</span>" if n["content"] and nid else ""
    kids = "".join(_node(tree, c, children) for c in children.get(nid, []))
    return f"<li class='node'>{''.join(bits)}{body}{f'<ul>{kids}</ul>' if kids else ''}</li>"


def render_html(records: Sequence[dict[str, Any]], title: str = "Rollout trees") -> str:
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{_CSS}</style>",
        f"<h1>{html.escape(title)}</h1>",
        "<p>Yellow: prefixes TRACE expanded, with the predictor's success probability p and the number of "
        "continuations K it bought there. Green/red: leaf rewards.</p>",
    ]
    for t in records:
        children: dict[int, list[int]] = {}
        for n in t["nodes"][1:]:
            children.setdefault(n["parent"], []).append(n["id"])
        pred = "" if t["predicted"] is None else f" · predicted v={t['predicted']:.2f}"
        head = (
            f"<b>{html.escape(t['prompt_id'])}</b>: {html.escape(t['prompt'])} <span class='meta'>(answer "
            f"{html.escape(str(t['answer']))}; {t['bare_rollouts']} bare rollouts, {t['paths']} paths{pred}; "
            f"rewards {t['rewards']})</span>"
        )
        parts.append(
            f"<div class='tree{' mixed' if t['mixed'] else ''}'>{head}<ul>{_node(t, 0, children)}</ul></div>"
        )
    return "\n".join(parts)
