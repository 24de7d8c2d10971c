"""``onnxsmith predict --task faceage MODEL IMAGE --box x,y,w,h``: one prediction, for checking by hand."""

from __future__ import annotations

import argparse

from rich.text import Text

from onnxsmith.cli.common import add_fp16_mode_option, out, print_json
from onnxsmith.cli.task_args import add_task_arguments, task_options_from_args
from onnxsmith.core import options as opts
from onnxsmith.core.errors import UsageError


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument("image", help="the image")
    parser.add_argument("--box", metavar="X,Y,W,H", help="the face in the image (default: the image is a face crop)")
    add_task_arguments(parser)
    add_fp16_mode_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def parse_box(text: str | None) -> tuple[float, float, float, float] | None:
    from onnxsmith.tasks.widerface import box_problem  # here: importing a task loads the engines

    if text is None:
        return None
    try:
        x, y, w, h = (float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--box {text}: expected X,Y,W,H (pixels, top-left corner and size)") from None
    problem = box_problem((x, y, w, h))
    if problem:
        raise UsageError(f"--box {text}: {problem}")
    if w <= 0 or h <= 0:
        raise UsageError(f"--box {text}: width and height must be positive")
    return x, y, w, h


def run(args: argparse.Namespace) -> int:
    from onnxsmith import api  # here: --help loads no engine
    from onnxsmith.tasks import get_task

    task = get_task(args.task)
    options = opts.to_json(task_options_from_args(args, task))
    prediction = api.predict(
        args.model, args.image, task=args.task, box=parse_box(args.box), fp16_mode=args.fp16_mode, **options
    )
    if args.json:
        print_json(prediction)
    else:
        out.print(Text.assemble(task.describe_prediction(prediction), (f"  ({prediction['run']})", "dim")))
    return 0
