"""The fp32 islands of a conversion as a table: what was kept fp32, why, and what was measured there."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.unionfind import UnionFind
from onnxsmith.precision.convert import WRITER_REASON, PrecisionReport


def islands_table(result: PrecisionReport) -> list[dict]:
    """The fp32 islands: connected groups of fp32 nodes kept for the same kind of reason."""
    precision = result.precision
    small = result.small
    stream_peak = {v.name: d for d in result.streams for v in d.stream.values}

    def kind(node: ir.Node) -> str:
        tensor = precision.kept_for.get(node)
        if tensor is None:
            reason = precision.kept[node_label(node)]
            return "small tensors" if reason.startswith("small") else reason.split(" ")[0] + " policy"
        if tensor in stream_peak:
            return "residual stream"
        if result.keep_fp32.get(tensor, "").startswith(WRITER_REASON):
            return "stream writer"
        if tensor in result.unsafe:
            return "over range" if "max |x|" in result.unsafe[tensor].reason else "underflow"
        return "constant out of range" if tensor not in result.keep_fp32 else "kept by caller"

    kept = precision.kept_nodes
    kinds = {node: kind(node) for node in kept}
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
            writer = next(w for d in result.streams for w in d.writers if w[0] in result.keep_fp32[tensors[0]])
            peak, tensor = writer[1], writer[0]
            measured = f"{peak:.3g}"
        elif what in ("over range", "underflow"):
            worst = max(tensors, key=lambda t: result.unsafe[t].absmax)
            peak, tensor = result.unsafe[worst].absmax, worst
            measured = f"{peak:.3g}" if what == "over range" else result.unsafe[worst].reason
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
                "_peak": peak,
            }
        )
    rows.sort(key=lambda r: (-r["_peak"], r["kept for"], r["island"]))
    for row in rows:
        del row["_peak"]
    return rows
