"""The release's figures, as SVG text whose bytes depend only on the data.

matplotlib's SVG is made deterministic: no date or creator in the metadata, a
fixed salt for its element ids, text kept as text (no font-dependent glyph
paths). Figures are returned as ``data:`` URIs for ``<img>`` tags, so each
figure's ids and styles stay inside its own document.

Labels hold names from the model and the recipe: mathtext is off (a tensor named ``$\\frac{a}{b}$``
is those characters, not a formula that may not parse) and each name goes in through ``label``
(core/text.py: control characters, which SVG's XML cannot hold, shown escaped).
"""

from __future__ import annotations

import base64
import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullLocator

from onnxsmith.core.limits import FP16_MAX
from onnxsmith.core.text import for_plot_label as label

_STYLE = {
    "svg.hashsalt": "onnxsmith",
    "svg.fonttype": "none",
    "text.parse_math": False,
    "text.usetex": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def svg_text(fig) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _figure(width: float, height: float, *, nrows: int = 1, ncols: int = 1, **kwargs):
    with plt.rc_context(_STYLE):
        return plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kwargs)


def latency_figure(results: list[dict]) -> str:
    """Median latency (whisker to p90) and throughput against the batch size, one line per model.

    ``results``: BenchResult.to_json() dicts.
    """
    with plt.rc_context(_STYLE):
        fig, axes = _figure(8.5, 3.2, ncols=2)
        latency, throughput = axes[0]
        for i, r in enumerate(results):
            batches = [b["batch"] for b in r["batches"]]
            med = [b["median_ms"] for b in r["batches"]]
            upper = [max(0.0, b["p90_ms"] - b["median_ms"]) for b in r["batches"]]
            color = _COLORS[i % len(_COLORS)]
            latency.errorbar(
                batches, med, yerr=[[0] * len(med), upper], marker="o", capsize=3, label=label(r["name"]), color=color
            )
            throughput.plot(
                batches, [b["throughput_per_s"] for b in r["batches"]], marker="o", label=label(r["name"]), color=color
            )
        provider = results[0]["provider"] if results else "cpu"
        latency.set(
            xlabel="batch size",
            ylabel="latency per run (ms)",
            title=label(f"latency vs batch ({provider}; median, whisker to p90)"),
        )
        throughput.set(xlabel="batch size", ylabel="items per second", title="throughput at the median")
        for ax in (latency, throughput):
            ax.set_ylim(bottom=0)
            if results:
                ax.set_xticks(sorted({b["batch"] for r in results for b in r["batches"]}))
        latency.legend(fontsize=8)
        return svg_text(fig)


def ranges_figure(ranges: dict, title: str) -> str:
    """Per-tensor max |x| in graph order, the residual stream highlighted, its massive channel marked.

    ``ranges``: the build's measurements["ranges"]: ``tensors`` (name, order, absmax), ``residual``
    (tensor, order, absmax, channel) and ``massive`` (tensor, channel, absmax, per_channel, counts).
    """
    tensors = [t for t in ranges.get("tensors", []) if t["absmax"] > 0]
    residual = ranges.get("residual", [])
    massive = ranges.get("massive")
    with plt.rc_context(_STYLE):
        fig, axes = _figure(8.5, 5.6, nrows=2, gridspec_kw={"height_ratios": [3, 2]})
        ax, channels_ax = axes[0][0], axes[1][0]
        ax.scatter(
            [t["order"] for t in tensors],
            [t["absmax"] for t in tensors],
            s=6,
            color="#9a9a9a",
            label="every float tensor",
            zorder=2,
        )
        if residual:
            ax.plot(
                [p["order"] for p in residual],
                [p["absmax"] for p in residual],
                marker="o",
                markersize=4,
                color=_COLORS[0],
                label="residual stream (normalisation inputs)",
                zorder=3,
            )
        ax.axhline(FP16_MAX, color="#d62728", linestyle="--", linewidth=1, label="fp16 max 65,504")
        ax.set_yscale("log")
        ax.set(xlabel="position in the graph (node order)", ylabel="max |x| (log)", title=label(title))
        if massive:
            _massive_channel(ax, channels_ax, residual, massive)
        else:
            channels_ax.set_axis_off()
            channels_ax.text(
                0.5,
                0.5,
                "no normalisation layers: no residual stream to break down by channel",
                ha="center",
                va="center",
                transform=channels_ax.transAxes,
            )
        ax.legend(fontsize=8, loc="lower right")
        for a in (ax, channels_ax):  # log axes: no minor ticks (their labels cost more than the plot)
            a.yaxis.set_minor_locator(NullLocator())
        fig.subplots_adjust(hspace=0.45)
        return svg_text(fig)


def _massive_channel(ax, channels_ax, residual: list, massive: dict) -> None:
    """The massive activation annotated at its peak, and that tensor's max |x| per channel below, its channel red."""
    peak = next(p for p in residual if p["tensor"] == massive["tensor"])
    over = massive["tensors_over_fp16_max"]
    ax.annotate(
        f"channel {massive['channel']}: {massive['absmax']:.3g}"
        + (f" ({over} of {massive['residual_tensors']} residual tensors over fp16 max)" if over else ""),
        xy=(peak["order"], peak["absmax"]),
        xytext=(0.02, 0.78),
        textcoords="axes fraction",
        va="top",
        arrowprops={"arrowstyle": "->", "color": "#444444"},
        fontsize=8,
        bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "#cccccc"},
        zorder=5,
    )
    values = massive["per_channel"]
    channel = massive["channel"]
    floor = max(min(v for v in values if v > 0) / 2, 1e-6) if any(v > 0 for v in values) else 1e-6
    channels_ax.stairs(
        values, [i - 0.5 for i in range(len(values) + 1)], baseline=floor, fill=True, color=_COLORS[0]
    )  # one path however many channels (1,024 for a ViT-L)
    channels_ax.bar(
        [channel],
        [values[channel]],
        bottom=floor,
        width=max(1.0, len(values) / 150),
        color="#d62728",
        label=f"channel {channel}",
    )
    channels_ax.axhline(FP16_MAX, color="#d62728", linestyle="--", linewidth=1)
    channels_ax.set_yscale("log")
    channels_ax.set(
        xlabel="channel",
        ylabel="max |x| (log)",
        title=label(f"per-channel max |x| of '{_short(massive['tensor'])}' (the peak residual tensor)"),
    )
    channels_ax.legend(fontsize=8, loc="upper right")


def _short(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else "…" + name[-limit:]


def error_histograms(series: list[tuple[str, str, list[float], float | None]]) -> str:
    """One histogram per variant: (variant, what the values are, values, gate on their max or None)."""
    rows = max(1, len(series))
    with plt.rc_context(_STYLE):
        fig, axes = _figure(8.5, 1.5 + 1.4 * rows, nrows=rows, sharex=True)
        top = max((max(v) for _, _, v, _ in series if v), default=0.0)
        gates = [g for *_, g in series if g is not None and math.isfinite(g)]
        top = max([top] + gates) or 1.0
        bins = [top * i / 40 for i in range(41)]
        for (name, what, values, gate), (ax,) in zip(series, axes):
            ax.hist(values, bins=bins, color=_COLORS[0])
            if gate is not None:
                ax.axvline(gate, color="#d62728", linestyle="--", linewidth=1, label=f"gate {gate:g}")
                ax.legend(fontsize=8, loc="upper right")
            summary = f"n={len(values)}"
            if values:
                summary += f", mean {sum(values) / len(values):.3g}, max {max(values):.3g}"
            ax.set_title(label(f"{name}: {what} ({summary})"), fontsize=9, loc="left")
            ax.set_ylabel("count")
        axes[-1][0].set_xlabel(label(series[0][1]) if series else "")
        fig.subplots_adjust(hspace=0.6)
        return svg_text(fig)
