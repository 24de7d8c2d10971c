"""Tables that several commands print."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from onnxsmith.core.text import format_cosine
from onnxsmith.io.files import human_bytes

if TYPE_CHECKING:
    from onnxsmith.verify.compare import Comparison


def _num(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def comparison_table(comparison: Comparison) -> Table:
    modes = "; ".join(f"{name} run {mode}" for name, mode in comparison.modes.items())
    table = Table(
        title=f"{comparison.candidate} vs {comparison.reference} ({comparison.samples} input set(s); {modes})",
        title_justify="left",
        caption=None if comparison.bounds is None else f"gate: {comparison.bounds.describe()}",
        caption_justify="left",
    )
    columns = ("output", "shape", "max |Δ|", "mean |Δ|", "cosine", "RMS ratio", "|Δ| / allowed", "NaN/inf", "argmax")
    for column in (*columns, "ok"):
        table.add_column(column, justify="left" if column in ("output", "shape") else "right")
    for o in comparison.outputs:
        table.add_row(
            # a KV cache's numbers are the next step's logits' (verify/cache.py): say so where they are shown
            f"{o.name} (by next step)" if o.kind == "cache" else o.name,
            "x".join(str(d) for d in o.shape),
            _num(o.max_abs),
            _num(o.mean_abs),
            "-" if o.cosine is None else format_cosine(o.cosine),
            _num(o.magnitude, ".6g"),
            _num(o.worst, ".3g") if comparison.bounds is not None else "-",
            f"{o.nonfinite_test}" + (f" (ref {o.nonfinite_ref})" if o.nonfinite_ref else ""),
            _agreement(o),
            Text("yes", "green") if o.passed else Text("NO", "red"),
        )
    return table


def _agreement(o) -> str:
    """The argmax column: a tensor's argmax agreement, or what a structured output agrees by."""
    if o.agreement is not None and o.kind != "tensor":
        what = "matched" if o.kind == "detections" else "equal"
        return f"{o.agreement:.1%} {what}"
    return "-" if o.argmax_agreement is None else f"{o.argmax_agreement:.1%}"


def bytes_table(title: str, by_dtype: dict[str, int], params: dict[str, int] | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("dtype")
    if params is not None:
        table.add_column("parameters", justify="right")
    table.add_column("bytes", justify="right")
    for dtype, nbytes in by_dtype.items():
        row = [dtype]
        if params is not None:
            row.append(f"{params.get(dtype, 0):,}")
        row.append(human_bytes(nbytes))
        table.add_row(*row)
    return table
