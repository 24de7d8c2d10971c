"""The release card (README.md): what is in the release and what was proven about it.

A pure function of measurements.json, so ``onnxsmith card`` can re-render it and
two builds give the same card apart from the timed benchmark section (between
the ``<!-- timed -->`` markers). No dates, no absolute paths.

Names from the model and values from the recipe go in through ``md`` (text) and ``code``
(a code span) of core/text.py: a ``|`` cannot add a table cell, nor a name raw HTML or a link.
Only the recipe's prose (``description``, ``license``) is the author's own Markdown, as documented.
"""

from __future__ import annotations

from typing import Any

from onnxsmith.core.limits import FP16_MAX
from onnxsmith.core.text import for_markdown as md
from onnxsmith.core.text import for_markdown_code as code
from onnxsmith.release.bench import notes

TIMED_START = "<!-- timed -->"
TIMED_END = "<!-- /timed -->"
FAITHFUL_NOTE = (
    "Variants holding fp16 tensors are run storage-faithfully: every fp16 tensor is rounded to fp16 "
    "as a GPU holds it, so an overflow a GPU would hit shows here too (onnxruntime's CPU kernels "
    "would otherwise compute in fp32 and hide it)."
)


def render_card(m: dict[str, Any]) -> str:
    card = m["card"]
    source = m["source"]
    variants = m["variants"]
    published = [v for v in variants if v["published"]]
    out: list[str] = [f"# {md(card['title'])}", ""]
    if card.get("description"):
        out += [card["description"].strip(), ""]
    origin = f" ({md(card['homepage'])})" if card.get("homepage") else ""
    out += [
        f"Variants of {code(source['file'])}{origin}, sha256 `{source['sha256']}`, built by onnxsmith {m['onnxsmith']} "
        "from `recipe.toml` (included). Each was verified against the source before it was published; "
        "every number below was measured by that build.",
        "",
    ]
    out += _files(published, m.get("included", []))
    out += _outside(m.get("outside_recipe", []))
    out += _variants(variants)
    out += _io_table(source, published)
    if m.get("validation"):
        out += _validation(m["validation"], variants)
    out += _ranges(m.get("ranges"), published)
    out += _bench(m.get("bench"), m["tools"])
    out += _reproduce()
    out += ["## Tool versions", "", "| tool | version |", "|---|---|"]
    out += [f"| {name} | {version} |" for name, version in m["tools"].items()]
    out += [""]
    if card.get("license"):
        out += ["## License", "", card["license"].rstrip(), ""]
    return "\n".join(out).rstrip() + "\n"


def _files(published: list[dict], included: list[dict]) -> list[str]:
    out = ["## Files", ""]
    if not published:
        return out + ["No variant passed its gates: nothing is published.", ""]
    out += ["| file | variant | bytes | sha256 |", "|---|---|---:|---|"]
    rows = [(f, v["name"]) for v in published for f in v["files"]] + [(f, "all (included)") for f in included]
    for f, name in rows:
        out.append(f"| {code(f['path'], table=True)} | {md(name)} | {f['bytes']:,} | `{f['sha256']}` |")
    out += ["", "Check them with `sha256sum -c SHA256SUMS`; pin them by these hashes.", ""]
    return out


def _outside(names: list[str]) -> list[str]:
    """What the recipe took from outside its folder (it said allow_outside = true)."""
    if not names:
        return []
    what = [code(n) if n != "license_file" else "the license text (license_file)" for n in names]
    return [f"Taken from outside the recipe's folder (the recipe sets `allow_outside = true`): {', '.join(what)}.", ""]


def _variants(variants: list[dict]) -> list[str]:
    out = ["## Variants", ""]
    for v in variants:
        out += [f"### {md(v['name'])}" + ("" if v["published"] else " (not published)"), ""]
        if v.get("description"):
            out += [v["description"].strip(), ""]
        steps = (
            " → ".join(code(s["name"]) + _options(s.get("options", {})) for s in v.get("steps", []))
            or "none (the source re-saved)"
        )
        out += [f"Steps: {steps}.", ""]
        if not v["published"]:
            out += [f"Not published: {md(v['reason'])}", ""]
            continue
        for i, line in enumerate(v.get("headline", [])):  # what was achieved and why not more, first
            out += [f"**{md(line)}**" if i == 0 else md(line), ""]
        out += [f"- {md(n)}" for n in variant_notes(v)]
        nodes = v["nodes"]
        out.append(f"- {nodes['source']} nodes in the source, {nodes['variant']} in the variant.")
        peak = v.get("peak")
        if peak:
            verdict = "below" if peak["absmax"] <= FP16_MAX else "above"
            out.append(
                f"- Largest activation {peak['absmax']:.4g} in {code(peak['tensor'])} ({md(peak['storage'])}), "
                f"{verdict} fp16's 65,504; NaN/inf: {peak['nonfinite'] or 'none'}."
            )
        out += [f"- Runtime: {line}" for line in runtime_needs(v)]
        out.append("")
    return out


def _options(options: dict) -> str:
    shown = [f"{k}={_value(val)}" for k, val in options.items() if val not in (None, [], {}, "")]
    return f" ({md(', '.join(shown))})" if shown else ""


def _value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def variant_notes(v: dict) -> list[str]:
    """What its steps said, and why it was made twice if it was."""
    notes = [n for s in v["steps"] for n in s.get("notes", [])]
    if v.get("remade_after"):
        notes.append(
            f"made twice: the task's gates refused the first ({v['remade_after']}); the steps that can keep more "
            "of it exact were told how the gates measure"
        )
    return notes


def runtime_needs(v: dict) -> list[str]:
    """What a program loading this variant must do or have, as Markdown (names escaped)."""
    needs = []
    if v.get("runtime"):
        entries = ", ".join(f"{code(k)} = {code(val)}" for k, val in sorted(v["runtime"].items()))
        needs.append(f"set the session config entries {entries}.")
    contrib = [d for d in v.get("op_domains", []) if d not in ("ai.onnx", "ai.onnx.ml")]
    if contrib:
        needs.append(
            f"uses {md(', '.join(contrib))} operators: load it with onnxruntime (CPU, CUDA, WebGPU), "
            "not a plain ONNX runtime."
        )
    dtypes = v.get("params_by_dtype", {})
    if "FLOAT16" in dtypes:
        needs.append(
            "fp16 weights: made for GPUs (CUDA, WebGPU); onnxruntime's CPU provider runs it "
            "through casts, correctly but slower than fp32."
        )
    if not needs:
        needs.append("plain onnxruntime session, no special options.")
    return needs


_DTYPES = {"FLOAT": "float32", "DOUBLE": "float64", "FLOAT16": "float16", "BFLOAT16": "bfloat16"}


def dtype_name(name: str) -> str:
    return _DTYPES.get(name, name.lower())


def _dims(io: dict) -> str:
    return md(f"{dtype_name(io['dtype'])} [{', '.join(str(d) for d in io['dims'])}]")


def _io_table(source: dict, published: list[dict]) -> list[str]:
    out = [
        "## Inputs and outputs",
        "",
        "| | name | source | " + " | ".join(md(v["name"]) for v in published) + " |",
        "|---|---|---|" + "---|" * len(published),
    ]
    for kind in ("inputs", "outputs"):
        for _i, tensor in enumerate(source["io"][kind]):
            cells = []
            for v in published:
                match = next((t for t in v["io"][kind] if t["name"] == tensor["name"]), None)
                cells.append("missing" if match is None else ("same" if match == tensor else _dims(match)))
            out.append(
                f"| {kind[:-1]} | {code(tensor['name'], table=True)} | {_dims(tensor)} | " + " | ".join(cells) + " |"
            )
    return out + [""]


def _validation(spec: dict, variants: list[dict]) -> list[str]:
    validated = [v for v in variants if v.get("validation")]
    faithful = any(v["validation"]["modes"]["candidate"] != "native" for v in validated)
    out = [
        "## Validation",
        "",
        f"Against the source on {md(spec['data'])}. Task {code(spec['task'])}: {md(spec['summary'])}."
        + (f" {FAITHFUL_NOTE}" if faithful else ""),
        "",
    ]
    if not validated:
        return out + ["No variant got as far as validation.", ""]
    out += [
        "| metric | gate | " + " | ".join(md(v["name"]) for v in validated) + " |",
        "|---|---|" + "---:|" * len(validated),
    ]
    first = validated[0]["validation"]["metrics"]
    for i, metric in enumerate(first):
        gate = "-" if metric["gate"] is None else f"{'≤' if metric['better'] == 'lower' else '≥'} {metric['gate']:g}"
        cells = []
        for v in validated:
            mv = v["validation"]["metrics"][i]
            mark = "" if mv["passed"] is None else (" ✓" if mv["passed"] else " ✗")
            cells.append(md(mv["display"]) + mark)
        out.append(f"| {md(metric['label'])} | {gate} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Raw outputs on the calibration samples (the transforms' own gate):",
        "",
        "| variant | output | max abs diff | cosine | NaN/inf |",
        "|---|---|---:|---:|---:|",
    ]
    for v in variants:
        for o in worst_outputs((v.get("verification") or {}).get("outputs", [])):
            cosine = "-" if o["cosine"] is None else f"{o['cosine']:.6f}"
            out.append(
                f"| {md(v['name'])} | {code(o['name'], table=True)} | {o['max_abs']:.3g} | {cosine} "
                f"| {o['nonfinite_test']} |"
            )
    return out + [""]


def worst_outputs(outputs: list[dict]) -> list[dict]:
    """One row per output name (a gate may list an output once per input set): the worst of each."""
    worst: dict[str, dict] = {}
    for o in outputs:
        w = worst.setdefault(o["name"], dict(o))
        w["max_abs"] = max(w["max_abs"], o["max_abs"])
        w["nonfinite_test"] = max(w["nonfinite_test"], o["nonfinite_test"])
        if o["cosine"] is not None:
            w["cosine"] = o["cosine"] if w["cosine"] is None else min(w["cosine"], o["cosine"])
    return list(worst.values())


def _ranges(ranges: dict | None, published: list[dict]) -> list[str]:
    if not ranges:
        return []
    out = ["## Activation ranges", ""]
    massive = ranges.get("massive")
    tensors = ranges.get("tensors", [])
    if tensors:
        top = max(tensors, key=lambda t: t["absmax"])
        out.append(
            f"Source, measured on {md(ranges['measured_on'])}: the largest activation is {top['absmax']:.4g} "
            f"({code(top['name'])})."
        )
    if massive:
        out.append(
            f"In the residual stream (the inputs of the {massive['residual_tensors']} normalisation layers) "
            f"channel {massive['channel']} peaks at {massive['absmax']:.4g}; "
            f"{massive['tensors_over_fp16_max']} of {massive['residual_tensors']} residual tensors exceed "
            "fp16's 65,504."
            if massive["tensors_over_fp16_max"]
            else f"In the residual stream channel {massive['channel']} peaks at {massive['absmax']:.4g}, "
            "within fp16's range."
        )
    out += ["", "report.html plots them per layer.", ""]
    return out


def _bench(bench: dict | None, tools: dict) -> list[str]:
    if not bench:
        return []
    s = bench["settings"]
    out = [
        TIMED_START,
        "## Benchmark",
        "",
        f"onnxruntime {tools.get('onnxruntime', '?')}, {md(s['provider'])} provider, {md(s['machine'])}; "
        f"{s['runs']} timed runs per batch after {s['warmup']} warm-up run(s), each model in its own process. "
        "Timings are of the build machine at build time and differ from build to build.",
        "",
        "| model | batch | median | p90 | throughput | session load | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in bench["results"]:
        for i, b in enumerate(r["batches"]):
            name, load, rss = (
                (md(r["name"]), f"{r['load_ms']:.0f} ms", f"{r['peak_rss_bytes'] / 2**20:.0f} MiB")
                if i == 0
                else ("", "", "")
            )
            out.append(
                f"| {name} | {b['batch']} | {b['median_ms']:.2f} ms | {b['p90_ms']:.2f} ms | "
                f"{b['throughput_per_s']:.1f}/s | {load} | {rss} |"
            )
    noted = notes(bench)
    return out + ([""] + [f"- {md(line)}" for line in noted] if noted else []) + ["", TIMED_END]


def _reproduce() -> list[str]:
    return [
        "## Reproducing",
        "",
        "`onnxsmith build recipe.toml` rebuilds this release. On the same machine and tool versions the model "
        "files, SHA256SUMS and recipe.toml come out byte-identical, and so do measurements.json (all but its "
        "`bench` entry), this card and report.html (all but their timed benchmark sections).",
        "",
    ]
