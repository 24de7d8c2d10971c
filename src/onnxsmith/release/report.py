"""report.html: the release's measurements as one self-contained page.

No script, no external CSS, fonts or images: the figures are SVG data URIs
(see :mod:`onnxsmith.release.plots`), so the page renders offline and its bytes
depend only on measurements.json. The latency section is timed and sits between
the ``<!-- timed -->`` markers. Every string from the model or the recipe goes in through
``escape`` (core/text.py's for_html: entities, and control characters shown as escapes).
"""

from __future__ import annotations

import math
from typing import Any

from onnxsmith.core.limits import FP16_MAX
from onnxsmith.core.text import for_html as escape
from onnxsmith.release import plots
from onnxsmith.release.bench import notes
from onnxsmith.release.card import FAITHFUL_NOTE, TIMED_END, TIMED_START, runtime_needs, variant_notes
from onnxsmith.release.confidence import INTERVALS_NOTE, WORST, interval_text

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; margin: 0;
       background: #f6f7f9; }
main { max-width: 980px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 1px solid #e3e5e8; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
p.meta { color: #5b6068; margin: 0 0 12px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13px; }
th, td { border: 1px solid #e3e5e8; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f2f4f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; background: #f2f4f7; padding: 1px 3px;
       border-radius: 3px; word-break: break-all; }
.ok { color: #137333; font-weight: 600; }
.fail { color: #b3261e; font-weight: 600; }
.ci { color: #5b6068; white-space: nowrap; }
img.figure { width: 100%; height: auto; border: 1px solid #eceef1; margin: 6px 0; }
ul { margin: 4px 0 8px; padding-left: 20px; }
"""


def _table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(svg: str, alt: str) -> str:
    return f'<img class="figure" alt="{escape(alt)}" src="{plots.data_uri(svg)}">'


def render_report(m: dict[str, Any]) -> str:
    card = m["card"]
    source = m["source"]
    variants = m["variants"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(card['title'])} — release report</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>{escape(card['title'])}</h1>",
        f'<p class="meta">Variants of <code>{escape(source["file"])}</code> (sha256 '
        f"<code>{source['sha256']}</code>), built by onnxsmith {escape(m['onnxsmith'])}.</p>",
    ]
    parts += _variants_section(variants)
    if m.get("validation"):
        parts += _validation_section(m["validation"], variants)
    if m.get("ranges"):
        parts += _ranges_section(m["ranges"], variants)
    if m.get("bench"):
        parts += _bench_section(m["bench"])
    tools = ", ".join(f"{escape(k)} {escape(v)}" for k, v in m["tools"].items())
    parts += [f'<h2>Tool versions</h2><p class="meta">{tools}</p>', "</main></body></html>"]
    return "\n".join(parts) + "\n"


def _status(ok: bool, text: str) -> str:
    return f'<span class="{"ok" if ok else "fail"}">{escape(text)}</span>'


def _variants_section(variants: list[dict]) -> list[str]:
    rows = []
    for v in variants:
        files = "<br>".join(f"<code>{escape(f['path'])}</code>" for f in v.get("files", []))
        size = sum(f["bytes"] for f in v.get("files", []))
        peak = v.get("peak")
        rows.append(
            [
                escape(v["name"]),
                _status(True, "published")
                if v["published"]
                else _status(False, "not published") + f"<br>{escape(v['reason'])}",
                " → ".join(escape(s["name"]) for s in v.get("steps", [])) or "-",
                files or "-",
                f"{size:,}" if size else "-",
                f"{v['nodes']['source']} → {v['nodes']['variant']}" if v.get("nodes") else "-",
                f"{peak['absmax']:.4g}" if peak else "-",
            ]
        )
    out = [
        "<h2>Variants</h2>",
        _table(["variant", "status", "steps", "files", "bytes", "nodes", "largest activation in fp16"], rows, {4, 6}),
    ]
    for v in variants:
        if not v["published"]:
            continue
        notes = variant_notes(v) + [f"Runtime: {r}" for r in runtime_needs(v)]
        headline = "".join(
            f"<p><strong>{escape(line)}</strong></p>" if i == 0 else f"<p>{escape(line)}</p>"
            for i, line in enumerate(v.get("headline", []))
        )
        out.append(
            f"<h3>{escape(v['name'])}</h3>{headline}<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>"
        )
    return out


def _validation_section(spec: dict, variants: list[dict]) -> list[str]:
    validated = [v for v in variants if v.get("validation")]
    faithful = any(v["validation"]["modes"]["candidate"] != "native" for v in validated)
    out = [
        "<h2>Validation</h2>",
        f"<p>Against the source on {escape(spec['data'])} (task <code>{escape(spec['task'])}</code>)"
        + (
            f", run in {escape(validated[0]['validation']['ran_on'])}"
            if validated and validated[0]["validation"].get("ran_on")
            else ""
        )
        + ". "
        + (escape(FAITHFUL_NOTE) if faithful else "")
        + "</p>",
    ]
    if not validated:
        return out + ["<p>No variant got as far as validation.</p>"]
    rows = []
    for i, metric in enumerate(validated[0]["validation"]["metrics"]):
        gate = (
            "-"
            if metric["gate"] is None
            else escape(f"{'≤' if metric['better'] == 'lower' else '≥'} {metric['gate']:g}")
        )
        cells = []
        for v in validated:
            mv = v["validation"]["metrics"][i]
            cell = escape(mv["display"]) if mv["passed"] is None else _status(mv["passed"], mv["display"])
            interval = interval_text(mv.get("interval"))
            cells.append(cell + (f' <span class="ci">({escape(interval)})</span>' if interval else ""))
        rows.append([escape(metric["label"]), gate, *cells])
    out.append(_table(["metric", "gate", *[v["name"] for v in validated]], rows, set(range(1, 2 + len(validated)))))
    if any(mv.get("interval") for v in validated for mv in v["validation"]["metrics"]):
        out.append(f'<p class="meta">{escape(INTERVALS_NOTE)}</p>')
    out += _worst_section(validated)
    series = []
    for v in validated:
        errors = v["validation"]["errors"]
        for what, values in errors.items():
            gate = next(
                (
                    mv["gate"]
                    for mv in v["validation"]["metrics"]
                    if mv["name"].startswith("max_") and mv["gate"] is not None
                ),
                None,
            )
            series.append((v["name"], what, values, gate))
    if series:
        out.append("<h3>Error distribution per variant</h3>")
        out.append(_figure(plots.error_histograms(series), "histograms of the errors of each variant"))
    return out


def _worst_section(validated: list[dict]) -> list[str]:
    """Each variant's worst samples (``Validation.worst``), by the metric they are ranked by."""
    items = []
    for v in validated:
        worst = v["validation"].get("worst") or []
        if not worst:
            continue
        labels = {m["name"]: m["label"] for m in v["validation"]["metrics"]}
        label = labels.get(worst[0]["metric"], worst[0]["metric"])
        samples = "; ".join(
            f"<code>{escape(w['sample'])}</code> "
            + ("NaN/inf" if w["value"] is None or not math.isfinite(w["value"]) else f"{w['value']:.4g}")
            for w in worst
        )
        items.append(f"<li>{escape(v['name'])} ({escape(label)} of each sample alone): {samples}</li>")
    if not items:
        return []
    return [
        "<h3>Worst samples per variant</h3>",
        f"<p>The samples to look at first: up to {WORST} with the largest errors, largest first.</p>",
        "<ul>" + "".join(items) + "</ul>",
    ]


def _ranges_section(ranges: dict, variants: list[dict]) -> list[str]:
    out = [
        "<h2>Activation ranges</h2>",
        f"<p>Every float tensor of the source, measured on {escape(ranges['measured_on'])}; the residual "
        "stream is what the normalisation layers read. Above the dashed line a value is infinite in fp16.</p>",
        _figure(plots.ranges_figure(ranges, "source: max |x| per tensor"), "activation ranges of the source"),
    ]
    rows = []
    for v in variants:
        peak = v.get("peak")
        if peak:
            rows.append(
                [
                    escape(v["name"]),
                    f"{peak['absmax']:.4g}",
                    f"<code>{escape(peak['tensor'])}</code>",
                    escape(peak["storage"]),
                    str(peak["over_fp16_max"]),
                    str(peak["nonfinite"]),
                ]
            )
    if rows:
        out.append("<p>The fp16 variants, run as a GPU holds their values:</p>")
        out.append(
            _table(
                ["variant", "largest activation", "tensor", "held as", f"tensors over {FP16_MAX:,.0f}", "NaN/inf"],
                rows,
                {1, 4, 5},
            )
        )
    return out


def _bench_section(bench: dict) -> list[str]:
    s = bench["settings"]
    rows = []
    for r in bench["results"]:
        for i, b in enumerate(r["batches"]):
            rows.append(
                [
                    escape(r["name"]) if i == 0 else "",
                    str(b["batch"]),
                    f"{b['median_ms']:.2f} ms",
                    f"{b['p90_ms']:.2f} ms",
                    f"{b['throughput_per_s']:.1f}/s",
                    f"{r['load_ms']:.0f} ms" if i == 0 else "",
                    f"{r['peak_rss_bytes'] / 2**20:.0f} MiB" if i == 0 else "",
                ]
            )
    return [
        TIMED_START,
        "<h2>Latency</h2>",
        f"<p>{escape(s['provider'])} provider, {escape(s['machine'])}; {s['runs']} timed runs per batch after "
        f"{s['warmup']} warm-up run(s), each model in its own process. Timed at build time: these numbers differ "
        "from build to build.</p>",
        _figure(plots.latency_figure(bench["results"]), "latency and throughput against batch size"),
        _table(["model", "batch", "median", "p90", "throughput", "session load", "peak RSS"], rows, {1, 2, 3, 4, 5, 6}),
        *(f"<p>{escape(line)}</p>" for line in notes(bench)),
        *_validation_times(bench.get("validation") or []),
        TIMED_END,
    ]


def _validation_times(timings: list[dict]) -> list[str]:
    """How long each variant's validation took, and its rate (the first also ran the source)."""
    rows = [
        [
            escape(t["variant"]),
            str(t["samples"]),
            f"{t['seconds']:.1f} s",
            f"{t['samples'] / t['seconds']:.1f}/s" if t["seconds"] else "",
            escape(t["ran_on"]),
        ]
        for t in timings
        if t.get("seconds") is not None
    ]
    if not rows:
        return []
    return [
        "<h3>Validation time</h3>",
        "<p>Wall time of each variant's validation, with the source's run on the samples where it was the first to need it.</p>",
        _table(["variant", "samples", "wall", "samples/s", "where"], rows, {1, 2, 3}),
    ]
