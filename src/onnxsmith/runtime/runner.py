"""Running models in onnxruntime, from a file or from an in-memory onnx-ir model."""

from __future__ import annotations

import math
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from onnxsmith.core.errors import InputError, TimeLimitExceeded, UsageError
from onnxsmith.io.load import load_model
from onnxsmith.runtime.fp16_storage import emulate_fp16_storage, has_fp16
from onnxsmith.runtime.inputs import adapt_feeds
from onnxsmith.settings.run import DEFAULT_RUN_TIMEOUT, FP16_MODES, RUN_TIMEOUT_ENV

CPU = ["CPUExecutionProvider"]

#: How a model was run: fp16 tensors rounded to fp16 as a GPU holds them, or as onnxruntime likes.
FAITHFUL = "storage-faithful fp16"
NATIVE = "native"

#: Initializers at least this big are fed to onnxruntime as input arrays (see open_session).
FED_BYTES = 64 * 1024
#: Their dtypes: those numpy and onnxruntime share (4-bit and bfloat16 weights stay in the protobuf).
_FED_DTYPES = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.FLOAT16,
        ir.DataType.DOUBLE,
        ir.DataType.INT8,
        ir.DataType.UINT8,
        ir.DataType.INT16,
        ir.DataType.UINT16,
        ir.DataType.INT32,
        ir.DataType.UINT32,
        ir.DataType.INT64,
        ir.DataType.UINT64,
        ir.DataType.BOOL,
    }
)


def session_options(
    *,
    optimize: bool = True,
    threads: int | None = None,
    config: dict[str, str] | None = None,
    priority_order: bool = False,
):
    """``priority_order``: run each node as soon as its inputs exist, so a probe's reductions free what they read."""
    options = ort.SessionOptions()
    # Fatal only: an error onnxruntime logs (`[E:onnxruntime:...] ExecuteKernel ...`) also comes back as the
    # exception that onnxsmith turns into its one-line error; printed as well, it would be a second message.
    options.log_severity_level = 4
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    if priority_order:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return options


@dataclass
class Session:
    """An onnxruntime session and the weights :func:`run` feeds it (those of an in-memory model)."""

    ort_session: ort.InferenceSession
    #: Weights the session takes as inputs, by name (see :func:`open_session`).
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def get_inputs(self):
        return self.ort_session.get_inputs()

    def get_outputs(self):
        return self.ort_session.get_outputs()


def open_session(
    model: ir.Model | str | os.PathLike,
    *,
    providers: list[str] | None = None,
    options: ort.SessionOptions | None = None,
    label: str | os.PathLike | None = None,
) -> Session:
    """An onnxruntime session on a file or on an in-memory model.

    An in-memory model is never written out. Its big weights go to onnxruntime as inputs
    that :func:`run` feeds with the weights' own arrays: onnxruntime reads input arrays in
    place, while it copies every initializer it is given (``add_initializer`` and
    ``add_external_initializers`` both do, as does loading a protobuf). A weight still
    memory-mapped from the source file is then never copied, and a 1 GB model costs no
    1 GB write, parse and copy per session. The cost: onnxruntime does not fold what it
    computes from those weights (a Cast or Transpose of one runs in every call), which
    the few runs a check makes do not notice.

    With weights as inputs onnxruntime's transpose optimizer also sees a graph the file
    would not show it, and rewrites it where it would not: it pushes the Transpose of an
    interpolated position embedding (DINOv2's ``interpolate_pos_encoding``) through a cubic
    Resize, which its own CPU kernel then refuses ("'Cubic' mode only supports ... outermost
    2 scale values being 1"). Such a session runs without it (:data:`NOT_WITH_FED_WEIGHTS`):
    it changes the layout of the work, not the arithmetic.
    """
    providers = providers or CPU
    options = options or session_options()
    if not isinstance(model, ir.Model) and not _utf8(os.fspath(model)):
        # onnxruntime takes a path as UTF-8 text only: a file whose name is not runs from memory.
        label, model = label or model, load_model(model)
    if isinstance(model, ir.Model):
        proto, weights = _weights_as_inputs(model)
        disabled = [f"{name}_{provider}" for name in NOT_WITH_FED_WEIGHTS for provider in providers] if weights else []
        label = label or "<in-memory model>"
        return Session(_session(proto.SerializeToString(), options, providers, label, disabled), weights)
    return Session(_session(os.fspath(Path(model)), options, providers, label or model))


def load_runnable(path: str | os.PathLike) -> ir.Model:
    """``path`` loaded for a caller that only runs it (``eval-lm``): where onnx.checker refuses a model that
    onnxruntime opens, onnxruntime decides (onnxruntime-genai's builder writes such models: contrib ops, shapes
    the checker's inference disputes). One neither accepts is refused with the checker's message, which says more.
    """
    try:
        return load_model(path)
    except InputError as refused:
        model = load_model(path, checker=False)  # our own checks come first: their refusal stands as it was
        try:
            open_session(path, options=session_options(optimize=False))
        except InputError:
            raise refused from None
        return model


#: Graph optimizers a session whose weights are fed as inputs runs without (see :func:`open_session`).
NOT_WITH_FED_WEIGHTS = ("TransposeOptimizer",)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _weights_as_inputs(model: ir.Model) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model's protobuf with its big main-graph weights turned into inputs, and those weights by name.

    Fed: every weight of at least :data:`FED_BYTES` whose dtype numpy and onnxruntime
    share. Any other weight kept in a file (small, 4-bit or bfloat16, or in a subgraph)
    is read into the protobuf: one loaded from bytes cannot point into files. The model
    is changed only while it is serialised, and restored exactly (initializer order included).
    """
    graph = model.graph
    initializers = list(graph.initializers.values())
    fed = [
        value
        for value in initializers
        if value.const_value is not None
        and value.const_value.dtype in _FED_DTYPES
        and value.const_value.nbytes >= FED_BYTES
    ]
    fed_set = set(fed)
    inlined = [
        value
        for g in model.graphs()
        for value in g.initializers.values()
        if value not in fed_set and isinstance(value.const_value, ir.ExternalTensor)
    ]
    if not fed and not inlined:
        return ir.serde.serialize_model(model), {}
    inputs = len(graph.inputs)
    file_tensors: list[tuple[ir.Value, ir.TensorProtocol]] = []
    try:
        for value in inlined:
            file_tensors.append((value, value.const_value))
            value.const_value = ir.Tensor(value.const_value.numpy(), dtype=value.const_value.dtype, name=value.name)
        for value in fed:
            if not value.is_graph_input():
                graph.inputs.append(value)
            del graph.initializers[value.name]
        proto = ir.serde.serialize_model(model)
    finally:
        while len(graph.inputs) > inputs:
            graph.inputs.pop()  # one by one: onnx-ir's slice deletion leaves values marked as inputs
        graph.initializers.clear()
        for value in initializers:
            graph.initializers.add(value)
        for value, tensor in file_tensors:
            value.const_value = tensor
    return proto, {value.name: value.const_value.numpy() for value in fed}


def _session(model: str | bytes, options, providers, label, disabled=()) -> ort.InferenceSession:
    try:
        if disabled:
            return ort.InferenceSession(
                model, sess_options=options, providers=providers, disabled_optimizers=list(disabled)
            )
        return ort.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as err:  # onnxruntime raises its own exception types
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"onnxruntime cannot load the model: {message}", label) from None


def run(
    session: Session,
    feeds: dict[str, np.ndarray],
    outputs: list[str] | None = None,
    *,
    label: str | os.PathLike | None = None,
) -> dict[str, np.ndarray]:
    """Outputs by name."""
    names = outputs or [o.name for o in session.get_outputs()]
    feeds = {**feeds, **session.weights}
    values = _bounded(lambda options: session.ort_session.run(names, feeds, options), 1, label)
    return dict(zip(names, values))


def timed_runs(session: Session, feeds: dict[str, np.ndarray], runs: int, *, label=None) -> float:
    """Mean seconds per run of ``runs`` runs, timed in the thread that runs them: handing each run over
    (see :func:`_bounded`) would cost more than a small model's run, and be timed with it."""
    feeds = {**feeds, **session.weights}

    def timed(options: ort.RunOptions) -> float:
        start = time.perf_counter()
        for _ in range(runs):
            session.ort_session.run(None, feeds, options)
        return (time.perf_counter() - start) / runs

    return _bounded(timed, runs, label)


def run_timeout() -> float | None:
    """Seconds one run of a model may take (:data:`RUN_TIMEOUT_ENV`, else the default); None: no limit."""
    text = os.environ.get(RUN_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_RUN_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"{RUN_TIMEOUT_ENV}={text!r}: expected seconds, a number > 0 (0: no limit)")
    return seconds or None


#: How often a thread waiting on a run looks up: a signal that another thread took is seen this late.
_WAKE_SECONDS = 0.25


def _bounded(call: Callable[[ort.RunOptions], object], runs: int, label):
    """``call(run_options)`` (onnxruntime runs) in a worker thread, stopped through its RunOptions past the
    time limit (``runs`` times :func:`run_timeout`) or when this thread is interrupted.

    A run is C++: the thread in it takes no Python signal handler until it returns, so Ctrl-C would wait for
    a run that may never end. This thread waits on the run instead, where a signal interrupts it; then the
    run is told to stop (onnxruntime checks between nodes, Loop iterations included), and only once it has
    stopped does KeyboardInterrupt (or SIGTERM's Terminated) go on unwinding: its arrays are in use until then.
    """
    limit = run_timeout()
    options = ort.RunOptions()
    job = _Job(lambda: call(options))
    _WORKERS.submit(job)
    try:
        _wait(job, None if limit is None else time.monotonic() + limit * runs)
    except BaseException:  # Ctrl-C, SIGTERM: stop the run; a second Ctrl-C interrupts this wait too
        options.terminate = True
        _wait(job, None)
        raise
    if not job.done.is_set():
        options.terminate = True
        _wait(job, None)
        if job.error is not None:  # stopped; a run that ended just then is kept
            seconds = f"{limit:g}"
            raise TimeLimitExceeded(
                f"onnxruntime ran the model past the {seconds} s limit of one run and was stopped; "
                f"if it needs longer, raise the limit: {RUN_TIMEOUT_ENV}=SECONDS (0: none)",
                label,
            )
    if job.error is not None:
        err = job.error
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"onnxruntime failed to run the model: {message}", label) from None
    return job.result


def _wait(job: _Job, deadline: float | None) -> None:
    """Until ``job`` is done or ``deadline`` (time.monotonic()) passes, waking every :data:`_WAKE_SECONDS`:
    a signal handler runs in this thread between waits even when the signal interrupted another thread."""
    while not job.done.wait(
        _WAKE_SECONDS if deadline is None else max(0.0, min(_WAKE_SECONDS, deadline - time.monotonic()))
    ):
        if deadline is not None and time.monotonic() >= deadline:
            return


@dataclass
class _Job:
    call: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None


class _Workers:
    """Daemon threads that run jobs for the threads waiting on them (:func:`_bounded`), kept for the next
    job: starting a thread per run would cost more than a small model's run."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0

    def submit(self, job: _Job) -> None:
        with self.lock:
            start = self.idle == 0
            if not start:
                self.idle -= 1
        if start:
            threading.Thread(target=self._serve, name="onnxsmith-run", daemon=True).start()
        self.jobs.put(job)

    def _serve(self) -> None:
        if hasattr(signal, "pthread_sigmask"):  # signals go to the waiting thread: one in a run cannot act
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        while True:
            job = self.jobs.get()
            try:
                job.result = job.call()
            except BaseException as err:  # onnxruntime's own exception types; reported by the waiting thread
                job.error = err
            # The call holds the feeds, weights memory-mapped from a file among them: kept by this idle thread,
            # they would keep the map alive (release_weights could not close it) until the next job.
            job.call = _done
            with self.lock:
                self.idle += 1  # before done: the waiting thread's next run finds this thread idle
            job.done.set()
            del job  # its feeds and outputs are the waiting thread's to keep or drop


def _done() -> None:
    """What a finished job's call becomes (see :meth:`_Workers._serve`)."""


_WORKERS = _Workers()
if hasattr(os, "register_at_fork"):  # a child made by fork has none of these threads
    os.register_at_fork(after_in_child=_WORKERS.__init__)


def run_mode(model: ir.Model, fp16_mode: str) -> str:
    """``auto``: a model with fp16 tensors runs storage-faithfully; ``native``: as onnxruntime likes."""
    if fp16_mode not in FP16_MODES:
        raise InputError(f"unknown fp16 mode '{fp16_mode}' (choose from {', '.join(FP16_MODES)})")
    return FAITHFUL if fp16_mode == "auto" and has_fp16(model) else NATIVE


def prepare_session(path: str | os.PathLike, fp16_mode: str = "auto", *, providers=None, threads: int | None = None):
    """A session on ``path``, fp16 storage emulated when the mode asks; returns (session, model, mode).

    ``model`` is what the session runs: emulated when it is, with the file's inputs and outputs either way.
    ``threads``: onnxruntime's intra-op threads (None: its own choice, one per core).
    """
    model = load_model(path)
    mode = run_mode(model, fp16_mode)
    options = session_options(threads=threads)
    if mode == FAITHFUL and not providers:
        emulate_fp16_storage(model)  # keeps the interface: feeds are made for the file's inputs
        session = open_session(model, label=path, options=options)
    else:
        session = open_session(path, providers=providers, label=path, options=options)
    return session, model, mode


def run_all(session: Session, model: ir.Model, feeds_list: list[dict[str, np.ndarray]], label) -> dict[str, np.ndarray]:
    """Every output for every feed, concatenated along a new leading axis."""
    collected: dict[str, list[np.ndarray]] = {}
    for feeds in feeds_list:
        for name, value in run(session, adapt_feeds(feeds, model), label=label).items():
            collected.setdefault(name, []).append(value)
    return {name: np.stack(values) for name, values in collected.items()}
