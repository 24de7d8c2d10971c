"""``onnxsmith eval-lm MODEL... --text FILE``: loss, perplexity, KL and top-1 agreement on held-out text.

The text is tokenized with the first model's folder tokenizer (``tokenizer.json``
beside ``onnx/``; ``--tokenizer`` to choose another) and cut into windows; every
model predicts every next token of every window. The first model is the reference
(the fp32 source): the others are compared with it position by position.
"""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from onnxsmith.cli.common import err, flag_keywords, out, print_json, session_config
from onnxsmith.core.options import non_negative_int, positive_int
from onnxsmith.io.files import write_text_atomic
from onnxsmith.settings.lm import DEFAULT_WINDOW


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n", 1)[1] if __doc__ else None
    parser.add_argument("models", nargs="+", metavar="MODEL", help=".onnx files; the first is the reference")
    parser.add_argument("--text", required=True, metavar="FILE", help="held-out text (UTF-8)")
    parser.add_argument("--tokenizer", metavar="FILE", help="tokenizer.json (default: the first model's folder's)")
    parser.add_argument(
        "--window",
        type=positive_int,
        default=DEFAULT_WINDOW,
        help="tokens per window, at most the model's context (default %(default)s)",
    )
    parser.add_argument("--max-windows", type=positive_int, default=None, help="score at most this many windows")
    parser.add_argument("--threads", type=non_negative_int, default=None, help="onnxruntime intra-op threads")
    parser.add_argument(
        "--session-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an onnxruntime session config entry for every model (repeatable); session.disable_quant_qdq=1 "
        "scores a q4 model with the arithmetic onnxruntime-web runs it with (default: native onnxruntime, "
        "which fuses DequantizeLinear+MatMul into MatMulNBits)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--report", metavar="JSON", help="also write the scores as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api

    config = session_config(args.session_config)
    api.check_outputs([args.report], sources=args.models, run_only=True)
    with err.status("") as status:
        keywords = flag_keywords(args, api.eval_lm, session_config=config, progress=status.update)
        scored = api.eval_lm(args.models, args.text, **keywords)
    result = scored.to_json()
    if args.report:
        write_text_atomic(args.report, json.dumps(result, indent=2) + "\n")
    if args.json:
        print_json(result)
        return 0
    table = Table(
        title=f"{result['text']}: {result['windows']} window(s) of {result['window']} tokens; "
        f"reference {result['reference']}",
        title_justify="left",
    )
    for column in ("model", "tokens", "loss", "perplexity", "Δ loss", "KL (nats)", "top-1"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for s in scored.scores:
        table.add_row(
            s.model,
            str(s.tokens),
            f"{s.loss:.4f}",
            f"{s.perplexity:.2f}",
            "-" if s.loss_increase is None else f"{s.loss_increase:+.2%}",
            "-" if s.kl is None else f"{s.kl:.4f}",
            "-" if s.top1 is None else f"{s.top1:.1%}",
        )
    out.print(table)
    return 0
