"""Inputs that never end and runs that never end: a fifo named as a file to read is refused before it is
opened (opening one waits for a writer); a run of a model in onnxruntime stops at a time limit
(ONNXSMITH_RUN_TIMEOUT), and Ctrl-C or SIGTERM stops one within seconds, leaving nothing behind.

Every command runs in a process of its own with a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from tests.conftest import FIXTURES, assert_one_line_error, run_cli_in_process
from tests.support.models import mlp

REPO = Path(__file__).resolve().parents[2]
FACEAGE = FIXTURES / "faceage_dynamo.onnx"
GPT2 = FIXTURES / "gpt2" / "onnx" / "model.onnx"
TWICE = [FACEAGE, FACEAGE]  # source and variant of validate
#: A refusal takes the seconds Python needs to import onnxsmith; a fifo that is opened takes forever.
PATIENCE = 120


def _onnxsmith(*args, env: dict[str, str] | None = None, timeout: float = PATIENCE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxsmith", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def endless_loop() -> onnx.ModelProto:
    """y = x + 1, 2^62 times: a Loop whose condition stays true (a run that would take ~a million years)."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "one"], ["v_out"], name="add"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 4]),
        ],
        [numpy_helper.from_array(np.ones((1, 4), np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body, name="loop")],
        "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(2**62, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ---- fifos ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Good files, and a fifo in the place of each kind of file a command reads."""
    root = tmp_path_factory.mktemp("fifos")
    (root / "crops").mkdir()
    os.mkfifo(root / "crops" / "face.png")  # a crop folder with a fifo among its images
    (root / "images").mkdir()
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(root / "images" / "face.png")
    (root / "words.txt").write_text("a few words of held-out text\n" * 4, encoding="utf-8")
    for name in ("boxes.txt", "face.png", "inputs.npz", "text.txt", "tokenizer.json"):
        os.mkfifo(root / name)
    model = root / "model.onnx"
    model.write_bytes(mlp().SerializeToString())
    sha256 = hashlib.sha256(model.read_bytes()).hexdigest()
    (root / "recipe.toml").write_text(
        f'[source]\npath = "model.onnx"\nsha256 = "{sha256}"\n\n'
        '[[variants]]\nname = "fp16"\nsteps = [{ pass = "fp16" }]\n\n'
        '[validation]\ntask = "faceage"\ndata = "images"\nboxes = "boxes.txt"\n',
        encoding="utf-8",
    )
    return root


#: name -> (arguments, given the data folder; what the one-line error must say)
FIFOS = {
    "image in a crop folder": (
        lambda d: ["validate", "--task", "faceage", "--data", d / "crops", *TWICE],
        "face.png: is a fifo; the image must be a regular file",
    ),
    "image to predict": (
        lambda d: ["predict", "--task", "faceage", FACEAGE, d / "face.png"],
        "face.png: is a fifo; the image must be a regular file",
    ),
    "boxes file": (
        lambda d: ["validate", "--task", "faceage", "--data", d / "images", "--boxes", d / "boxes.txt", *TWICE],
        "boxes.txt: is a fifo; the annotation file must be a regular file",
    ),
    "npz of inputs": (
        lambda d: ["compare", d / "model.onnx", d / "model.onnx", "--inputs", d / "inputs.npz"],
        "inputs.npz: is a fifo; the .npz must be a regular file",
    ),
    "lm text": (
        lambda d: ["eval-lm", GPT2, "--text", d / "text.txt"],
        "text.txt: is a fifo; the text must be a regular file",
    ),
    "tokenizer": (
        lambda d: ["eval-lm", GPT2, "--text", d / "words.txt", "--tokenizer", d / "tokenizer.json"],
        "tokenizer.json: is a fifo; the tokenizer must be a regular file",
    ),
    "recipe's boxes": (
        lambda d: ["build", d / "recipe.toml", "--out", d / "release", "--no-bench"],
        "recipe.toml:12: [validation] task faceage: boxes is not a regular file or a folder: boxes.txt is a fifo",
    ),
}


@pytest.mark.parametrize("case", list(FIFOS))
def test_a_fifo_where_a_file_is_read_is_refused_without_waiting(data, case):
    arguments, message = FIFOS[case]
    start = time.monotonic()
    result = _onnxsmith(*arguments(data))  # a fifo opened for reading would wait here until the timeout
    assert_one_line_error(result, message)
    assert time.monotonic() - start < PATIENCE
    assert not (data / "release").exists()


# ---- time limits and signals ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endless(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("endless") / "loop.onnx"
    onnx.save(endless_loop(), path)
    return path


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(lambda m, out: ["fp16", m, out / "v.onnx"], id="fp16 calibrating"),
        pytest.param(lambda m, out: ["compare", m, m], id="compare verifying"),
    ],
)
def test_a_run_past_the_time_limit_is_stopped_with_exit_2(endless, tmp_path, command):
    out = tmp_path / "out"
    start = time.monotonic()
    result = _onnxsmith(*command(endless, out), env={"ONNXSMITH_RUN_TIMEOUT": "1"})
    assert_one_line_error(
        result, "loop.onnx: onnxruntime ran the model past the 1 s limit of one run", "ONNXSMITH_RUN_TIMEOUT=SECONDS"
    )
    assert time.monotonic() - start < PATIENCE
    assert not out.exists()


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_time_limit_is_refused_before_any_work(monkeypatch, tmp_path, value):
    monkeypatch.setenv("ONNXSMITH_RUN_TIMEOUT", value)
    model = tmp_path / "m.onnx"
    model.write_bytes(mlp().SerializeToString())
    result = run_cli_in_process("fp16", model, tmp_path / "out" / "v.onnx")
    assert_one_line_error(result, f"ONNXSMITH_RUN_TIMEOUT='{value}': expected seconds")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a live process has used so far (Linux: /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(
    ("signum", "code", "said"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_stops_a_run_within_seconds_and_leaves_nothing(endless, tmp_path, signum, code, said):
    """Ctrl-C (SIGINT) or SIGTERM while onnxruntime runs a Loop that never ends: the process ends within
    seconds, as it does anywhere else, with no output and no staging folder left behind."""
    # How much CPU time the command takes to reach its run: the same command stopped after 1 s of it.
    reach = subprocess.Popen(
        [sys.executable, "-m", "onnxsmith", "fp16", endless, tmp_path / "first" / "v.onnx"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "ONNXSMITH_RUN_TIMEOUT": "1"},
    )
    _, status, usage = os.wait4(reach.pid, 0)
    reach.returncode = os.waitstatus_to_exitcode(status)
    assert reach.returncode == 2
    in_the_run = usage.ru_utime + usage.ru_stime + 2  # past that, the endless run is surely under way

    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "onnxsmith", "fp16", endless, out / "v.onnx"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ONNXSMITH_RUN_TIMEOUT": "3600"},
        # As from a terminal: a shell starts background jobs with SIGINT ignored, and this may run in one.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + PATIENCE
        while _cpu_seconds(process.pid) < in_the_run:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the command never reached its run"
            time.sleep(0.1)
        sent = time.monotonic()
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert took < 10, took
    assert process.returncode == code, stderr
    assert stderr.strip().splitlines() == [f"onnxsmith: {said}"]
    assert not out.exists()  # no output, no staging folder, not even the folder made for it
