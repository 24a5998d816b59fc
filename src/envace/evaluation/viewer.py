"""The trajectory viewer of the experiment's report (``trajectories.html``): shadow trajectories of each arm,
each rehearsed observation beside the real one, mismatching leaves highlighted
(envace.evaluation.fidelity.mismatched_leaves); and the static page both HTML files of the report share
(:func:`page`: its style, and a script that marks the title once it ran, which tests use to detect script errors).
"""

from __future__ import annotations

import html
import json
from typing import Any

from .fidelity import METRICS as FID_METRICS
from .fidelity import Path, mismatched_leaves, observation_fidelity
from ..core.types import Trajectory

LOADED_SUFFIX = " [loaded]"
"""Appended to ``document.title`` by each page's script once it ran."""


def json_html(obj: Any, bad: set[Path], cls: str = "mm", path: Path = ()) -> str:
    """Compact JSON as HTML; leaves whose path is in ``bad`` are wrapped in ``<span class=cls>``."""
    if isinstance(obj, dict) and obj:
        inner = ", ".join(
            f'<span class="k">{html.escape(json.dumps(k, ensure_ascii=False))}</span>'
            f": {json_html(v, bad, cls, path + (k,))}"
            for k, v in obj.items()
        )
        return "{" + inner + "}"
    if isinstance(obj, list) and obj:
        return "[" + ", ".join(json_html(v, bad, cls, path + (i,)) for i, v in enumerate(obj)) + "]"
    text = html.escape(json.dumps(obj, ensure_ascii=False))
    return f'<span class="{cls}">{text}</span>' if path in bad else text


def trajectory_html(traj: Trajectory, anchor: str) -> str:
    """One shadow trajectory: user turns, Act outputs and, per call, the rehearsed vs the real observation."""
    users = [m.content for m in traj.messages if m.role == "user"]
    out = [f'<section class="traj" id="{anchor}" data-anchor="{anchor}">']
    out.append(
        f"<h3>{html.escape(traj.id)}</h3><p class='meta'>task {html.escape(traj.task_id)} · "
        f"mode {html.escape(traj.mode)} · truncated {html.escape(str(traj.truncated))}</p>"
    )
    turn = -1
    for si, step in enumerate(traj.steps):
        if step.user_turn != turn and step.user_turn < len(users):
            turn = step.user_turn
            out.append(f'<div class="user"><b>user</b> {html.escape(users[turn])}</div>')
        out.append(f'<div class="act"><b>act · step {si}</b><pre>{html.escape(step.action_text.strip())}</pre></div>')
        if not step.observations:
            continue
        out.append(
            '<table class="obs"><thead><tr><th>call</th><th>rehearsed</th>'
            "<th>real (shadow)</th><th>scores</th></tr></thead><tbody>"
        )
        for i, obs in enumerate(step.observations):
            src = step.sources[i] if i < len(step.sources) else "?"
            real = step.shadow[i] if i < len(step.shadow) else None
            call = step.calls[i].key() if i < len(step.calls) else "(unparsed)"
            if real is None:
                out.append(
                    f"<tr><td><code>{html.escape(call)}</code></td><td><span class='src'>{html.escape(src)}</span>"
                    f" <code>{json_html(obs, set())}</code></td><td class='na'>not recorded</td><td></td></tr>"
                )
                continue
            bad_r, bad_t = mismatched_leaves(obs, real)
            sc = observation_fidelity(obs, real)
            cls = "match" if sc["exact"] else "diff"
            scores = " ".join(f"{k}={sc[k]:.2f}" for k in FID_METRICS)
            out.append(
                f"<tr class='{cls}'><td><code>{html.escape(call)}</code></td>"
                f"<td><span class='src'>{html.escape(src)}</span> <code>{json_html(obs, bad_r, 'mm')}</code></td>"
                f"<td><code>{json_html(real, bad_t, 'miss')}</code></td><td class='sc'>{scores}</td></tr>"
            )
        out.append("</tbody></table>")
    out.append(f"<p class='meta'>counters: {html.escape(json.dumps(traj.counters, sort_keys=True))}</p></section>")
    return "\n".join(out)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;vertical-align:top}
th{background:#f3f3f3}td{font-variant-numeric:tabular-nums;white-space:nowrap}
.meta{color:#666;font-size:12px}img{max-width:560px;width:48%;border:1px solid #eee;margin:6px}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:pre-wrap;word-break:break-word}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:6px;margin:4px 0;font-size:12px}
.mm{background:#ffc9c9}.miss{background:#fff3b0}.k{color:#555}.src{font-size:11px;color:#fff;background:#888;border-radius:3px;padding:0 4px}
tr.match td{background:#eefbea}.na{color:#999}.sc{font-size:11px;color:#444;white-space:nowrap}
.user{background:#eef4ff;padding:6px;margin:6px 0}.act{margin:6px 0}.traj{border:1px solid #ddd;padding:10px;margin:12px 0}
.legend span{padding:0 6px;margin-right:8px}details{margin:6px 0}
"""  # noqa: E501


def page(title: str, body: str, script: str = "") -> str:
    js = f"document.title = document.title + {json.dumps(LOADED_SUFFIX)};"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n{body}\n"
        f"<script>\n(function () {{\n{script}\n{js}\n}})();\n</script>\n</body></html>\n"
    )


def viewer_html(results: dict[str, Any]) -> str:
    """The trajectory viewer page: a picker and one section per kept shadow trajectory."""
    sections, options = [], []
    for arm in results["arms"]:
        for seed in sorted(results["runs"].get(arm, {}), key=int):
            for j, d in enumerate(results["runs"][arm][seed].get("examples") or []):
                traj = Trajectory.from_dict(d)
                anchor = f"t-{arm}-{seed}-{j}"
                n_pairs = sum(1 for s in traj.steps for x in s.shadow if x is not None)
                options.append(
                    f"<option value='{anchor}'>{html.escape(arm)} · seed {seed} "
                    f"· {html.escape(traj.task_id)} · {n_pairs} compared</option>"
                )
                sections.append(
                    f"<div class='arm-label meta'>arm <b>{html.escape(arm)}</b>, seed {seed}</div>"
                    + trajectory_html(traj, anchor)
                )
    if not sections:
        sections = ["<p>No shadow trajectories were kept (fidelity_tasks = 0?).</p>"]
    body = (
        "<h1>Rehearsed vs real: shadow trajectories</h1>"
        "<p>Each row puts the observation the model <i>rehearsed</i> for a call next to what the real environment "
        "returned for the same call (<i>shadow</i> mode: recorded, never shown to the policy). "
        "<span class='legend'><span class='mm'>rehearsed leaf that is wrong or invented</span>"
        "<span class='miss'>real leaf not reproduced</span></span> Rows in green match exactly.</p>"
        f"<p><label>trajectory: <select id='pick'>{''.join(options)}</select></label> "
        "<label><input type='checkbox' id='all'> show all</label> · <a href='report.html'>back to the report</a></p>"
        f"<div id='trajs'>{''.join(sections)}</div>"
    )
    script = """
var pick = document.getElementById('pick'), all = document.getElementById('all');
function show() {
  var secs = document.querySelectorAll('section.traj');
  for (var i = 0; i < secs.length; i++) {
    var on = all.checked || secs[i].getAttribute('data-anchor') === pick.value;
    secs[i].style.display = on ? '' : 'none';
    var lab = secs[i].previousElementSibling;
    if (lab && lab.className.indexOf('arm-label') >= 0) { lab.style.display = on ? '' : 'none'; }
  }
}
pick.addEventListener('change', show); all.addEventListener('change', show); show();
"""
    return page("envace trajectory viewer", body, script)


__all__ = ["LOADED_SUFFIX", "CSS", "page", "json_html", "trajectory_html", "viewer_html"]
