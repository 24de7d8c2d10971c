"""How the precision engine's decisions are shown: notes, the fp32 islands table, the numbers.

Reads a :class:`~onnxsmith.precision.engine.PrecisionRecord` (what was measured, decided
and done) and decides nothing.
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.unionfind import UnionFind
from onnxsmith.irutil.walk import constant_tensors
from onnxsmith.precision.engine import PrecisionRecord
from onnxsmith.precision.plan import WRITER_REASON, StreamDecision, low_name

# ------------------------------------------------------------------ fp16


def stream_notes(streams: list[StreamDecision]) -> list[str]:
    """One line per residual stream: its peak, and how it is carried."""
    lines = []
    for decision in streams:
        line = f"residual stream: {decision.stream.describe()}, measured peak {decision.peak:.3g}"
        if decision.scale != 1.0:
            line += (
                f"; carried scaled by 1/{round(1 / decision.scale)} (writers' weights scaled, "
                f"{len(decision.stream.norms)} LayerNorm epsilons x {decision.scale**2:g})"
            )
        if decision.note:
            line += f"; {decision.note}"
        if decision.kept_fp32:
            line += "; kept fp32 end to end"
        for writer, peak, count in decision.writers:
            line += f"; '{writer}' ({peak:.3g}) written by {count} nodes kept fp32"
        lines.append(line)
    return lines


def conversion_notes(record: PrecisionRecord) -> list[str]:
    """What ``fp16`` measured and did, in the order it did it."""
    plan, precision, casts = record.plan, record.precision, record.applied.casts
    low = low_name(precision.dtype)
    notes = [
        f"measured {len(record.ranges)} float tensors; {len(plan.unsafe)} over the safe range "
        f"(max |x| > {plan.settings.limits.max_abs:,.0f}) or underflowing"
    ]
    notes += stream_notes(plan.streams)
    notes.append(
        f"{sum(precision.low_nodes.values())} of {sum(precision.float_nodes.values())} float nodes compute in {low} "
        f"({', '.join(f'{op} {n}' for op, n in precision.low_nodes.most_common(6))}); "
        f"{len(precision.kept)} kept fp32 in {len(islands_table(record))} island(s); "
        f"{precision.shape_nodes} shape computations left as they are"
    )
    notes.append(
        f"{precision.weights_converted} weights stored in {low} "
        f"({precision.weight_bytes_saved / 2**20:.1f} MB saved)"
        + (f"; {len(precision.weights_kept)} kept fp32 (also read in fp32)" if precision.weights_kept else "")
    )
    notes.extend(plan.store_low_checked)
    notes.append(f"casts: {precision.casts_added} inserted at island borders; {casts.describe()}")
    if precision.unknown_ops:
        notes.append(f"left fp32 (type rules unknown): {', '.join(sorted(set(precision.unknown_ops)))}")
    return notes


def conversion_stats(record: PrecisionRecord) -> dict:
    """The numbers of a conversion, for ``--report``."""
    plan, precision = record.plan, record.precision
    return {
        "measured_tensors": len(record.ranges),
        "unsafe_tensors": len(plan.unsafe),
        "low_nodes": dict(precision.low_nodes),
        "kept_fp32": dict(precision.kept),
        "casts_inserted": precision.casts_added,
        "cast_hygiene": vars(record.applied.casts),
        "weights_converted": precision.weights_converted,
        "residual_streams": [
            {"values": len(d.stream.values), "peak": d.peak, "scale": d.scale, "note": d.note} for d in plan.streams
        ],
    }


def weight_bytes_by_type(model: ir.Model) -> dict[str, int]:
    """The bytes of ``model``'s weights by dtype name ("float", "float16", "int8", ...)."""
    sizes: Counter = Counter()
    for const in constant_tensors(model):
        sizes[const.tensor.dtype.name.lower()] += const.tensor.nbytes
    return dict(sizes)


#: The weights count as "about half" when they are at most this share of the source's.
ABOUT_HALF = 0.55


def why_not_more(record: PrecisionRecord, before: dict[str, int], after: dict[str, int]) -> list[str]:
    """Why the weights are not about half the source's (the report's first lines), or nothing.

    ``before``/``after``: weight bytes by dtype name ("float", "float16", "int8", ...) of the
    source and the variant. Said in bytes, biggest first: weights of a type the conversion does
    not touch (an int8 model), then fp32 weights by the kind of reason that keeps their readers fp32.
    """
    total = sum(before.values())
    if not total or sum(after.values()) <= ABOUT_HALF * total:
        return []
    low = low_name(record.precision.dtype)
    lines = [
        f"{_mb(nbytes)} of the weights ({nbytes / total:.0%}) are {dtype}: {low} converts fp32 weights only"
        for dtype, nbytes in sorted(before.items(), key=lambda kv: (-kv[1], kv[0]))
        if dtype != "float" and nbytes >= total / 100
    ]
    readers = {node_label(n): n for n in record.precision.kept_nodes}
    # Measured: why weights that could have been stored low although read in fp32 were not.
    refused = {name: g.refused for g in record.plan.store_low_groups if g.refused for name in g.weights}
    groups: dict[str, list] = {}
    for name, (nbytes, reader, why) in record.precision.weights_fp32.items():
        node = readers.get(reader)
        kind = island_kind(record, node) if node is not None else why
        why = refused.get(name, why)
        group = groups.setdefault(kind, [0, 0, reader, why])
        group[0] += nbytes
        group[1] += 1
    # Kinds that hold under 1 % of the weights explain nothing about the size.
    ranked = sorted(((k, g) for k, g in groups.items() if g[0] >= total / 100), key=lambda kv: (-kv[1][0], kv[0]))
    for kind, (nbytes, count, reader, why) in ranked[:3]:
        where = f" ('{reader}': {why})" if reader and kind != why else ""
        lines.append(f"{_mb(nbytes)} of fp32 weights ({nbytes / total:.0%}, {count}) stay fp32: {kind}{where}")
    if len(ranked) > 3:
        rest = sum(g[0] for _, g in ranked[3:])
        lines.append(f"{_mb(rest)} more stay fp32 for {len(ranked) - 3} other kinds of reason (see the fp32 islands)")
    return lines


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


# ------------------------------------------------------------------ fuse --precision fp16


def fused_stream_notes(streams: list[StreamDecision]) -> list[str]:
    """The streams ``fuse`` rescaled (or could not) because they overflow."""
    notes = []
    for decision in streams:
        if not decision.overflows:
            continue
        if decision.stream.problem is not None:
            notes.append(f"residual stream peaks at {decision.peak:.3g} but is not rescaled: {decision.stream.problem}")
        elif decision.scale != 1.0:
            notes.append(
                f"residual stream ({decision.stream.describe()}, measured peak {decision.peak:.3g}) carried scaled "
                f"by 1/{round(1 / decision.scale)} so the fp16 projections that write it fit"
            )
    return notes


def fused_conversion_notes(record: PrecisionRecord) -> list[str]:
    precision, unsafe = record.precision, record.plan.unsafe
    low = precision.low_nodes
    return [
        f"fp16: {sum(low.values())} nodes compute in fp16 ({', '.join(f'{op} {n}' for op, n in low.most_common())}); "
        f"{len(precision.kept)} stay fp32 (residual stream, normalisations"
        + (f", {len(unsafe)} tensors measured out of fp16's range" if unsafe else "")
        + ")",
        *record.plan.store_low_checked,
        f"casts: {precision.casts_added} inserted; {record.applied.casts.describe()}",
    ]


# ------------------------------------------------------------------ the islands table


def island_kind(record: PrecisionRecord, node: ir.Node) -> str:
    """What kind of reason keeps ``node`` fp32: "residual stream", "over range", "LSTM policy", ..."""
    plan, precision = record.plan, record.precision
    tensor = precision.kept_for.get(node)
    if tensor is None:
        reason = precision.kept[node_label(node)]
        return "small tensors" if reason.startswith("small") else reason.split(" ")[0] + " policy"
    if any(tensor == v.name for d in plan.streams for v in d.stream.values):
        return "residual stream"
    if plan.keep_fp32.get(tensor, "").startswith(WRITER_REASON):
        return "stream writer"
    if tensor in plan.unsafe:
        return "over range" if "max |x|" in plan.unsafe[tensor].reason else "underflow"
    return "constant out of range" if tensor not in plan.keep_fp32 else "kept by caller"


def islands_table(record: PrecisionRecord) -> list[dict]:
    """The fp32 islands: connected groups of fp32 nodes kept for the same kind of reason."""
    plan, precision = record.plan, record.precision
    small = plan.small
    stream_peak = {v.name: d for d in plan.streams for v in d.stream.values}
    kept = precision.kept_nodes
    kinds = {node: island_kind(record, node) for node in kept}
    islands = UnionFind(kept)
    for node in kept:
        for value in node.outputs:
            for user, _ in value.uses():
                if user in islands and kinds[user] == kinds[node]:
                    islands.union(user, node)
    rows = []
    for nodes in islands.groups(kept):
        what = kinds[nodes[0]]
        tensors = [precision.kept_for[n] for n in nodes if precision.kept_for.get(n)]
        measured, tensor, peak = "-", "-", -1.0
        if what == "residual stream":
            decision = stream_peak[tensors[0]]
            peak = decision.peak
            measured = f"{peak:.3g}" + (
                f" (carried x1/{round(1 / decision.scale)}: {peak * decision.scale:.3g})"
                if decision.scale != 1.0
                else ""
            )
            tensor = decision.peak_tensor
        elif what == "stream writer":
            writer = next(w for d in plan.streams for w in d.writers if w[0] in plan.keep_fp32[tensors[0]])
            peak, tensor = writer[1], writer[0]
            measured = f"{peak:.3g}"
        elif what in ("over range", "underflow"):
            worst = max(tensors, key=lambda t: plan.unsafe[t].absmax)
            peak, tensor = plan.unsafe[worst].absmax, worst
            measured = f"{peak:.3g}" if what == "over range" else plan.unsafe[worst].reason
        elif what == "small tensors":
            outs = [o.name for n in nodes for o in n.outputs if o.name in small]
            tensor = outs[0] if outs else "-"
            measured = small.get(tensor, "-")
        else:
            measured = precision.kept[node_label(nodes[0])]
        ops = Counter(n.op_type for n in nodes)
        rows.append(
            {
                "island": node_label(nodes[0]),
                "kept for": what,
                "nodes": len(nodes),
                "ops": ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
                "measured": measured,
                "tensor": tensor,
                "weights": _island_weights(record, nodes),
                "_peak": peak,
            }
        )
    rows.sort(key=lambda r: (-r["_peak"], r["kept for"], r["island"]))
    for row in rows:
        del row["_peak"]
    return rows


def _island_weights(record: PrecisionRecord, nodes: list[ir.Node]) -> str:
    """How the weights an island's nodes read are stored: "fp32 1.1 MB", "fp16 24 KB (Cast at load)", "-"."""
    precision = record.precision
    fp32, low = {}, {}
    for node in nodes:
        for value in node.inputs:
            if value is None:
                continue
            producer = value.producer()
            if producer is not None and producer.op_type == "Cast" and producer.inputs:
                value = producer.inputs[0]  # a weight stored low, widened where it is read
            if value.name in precision.weights_cast_at_load:
                low[value.name] = precision.weights_cast_at_load[value.name]  # the bytes saved: what is stored
            elif value.name in precision.weights_fp32:
                fp32[value.name] = precision.weights_fp32[value.name][0]
    parts = [f"fp32 {_size(sum(fp32.values()))}"] if fp32 else []
    if low:
        parts.append(f"{low_name(precision.dtype)} {_size(sum(low.values()))} (Cast at load)")
    return ", ".join(parts) or "-"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.0f} KB" if n >= 2**10 else f"{n} B"
