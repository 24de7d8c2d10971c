"""``onnxsmith predict --task faceage MODEL IMAGE --box x,y,w,h``: one prediction, for checking by hand."""

from __future__ import annotations

import argparse

from onnxsmith.cli.common import out, print_json
from onnxsmith.cli.task_args import add_task_arguments, task_options_from_args
from onnxsmith.core.errors import UsageError
from onnxsmith.io.load import load_model
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import adapt_feeds
from onnxsmith.runtime.runner import FP16_MODES, prepare_session
from onnxsmith.tasks import get_task


def register(subparsers) -> None:
    parser = subparsers.add_parser("predict", help="run a model on one input and decode its answer (faceage)")
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument("image", help="the image")
    parser.add_argument("--box", metavar="X,Y,W,H", help="the face in the image (default: the image is a face crop)")
    add_task_arguments(parser)
    parser.add_argument(
        "--fp16-mode",
        choices=FP16_MODES,
        default="auto",
        help="auto: a model with fp16 tensors runs storage-faithfully; native: as onnxruntime runs it",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def parse_box(text: str | None) -> tuple[float, float, float, float] | None:
    if text is None:
        return None
    try:
        x, y, w, h = (float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--box {text}: expected X,Y,W,H (pixels, top-left corner and size)") from None
    if w <= 0 or h <= 0:
        raise UsageError(f"--box {text}: width and height must be positive")
    return x, y, w, h


def run(args: argparse.Namespace) -> int:
    task = get_task(args.task)
    if not hasattr(task, "predict_feeds"):
        raise UsageError(f"task '{task.name}' cannot predict from an image")
    options = task_options_from_args(args, task)
    model = load_model(args.model)
    feeds = task.predict_feeds(model, args.image, parse_box(args.box), options)
    session, model, mode = prepare_session(args.model, args.fp16_mode)
    outputs = runner.run(session, adapt_feeds(feeds, model), label=args.model)
    prediction = task.decode(outputs, options)[0]
    if args.json:
        print_json({**prediction, "run": mode})
    else:
        out.print(task.describe_prediction(prediction) + f"  [dim]({mode})[/]")
    return 0
