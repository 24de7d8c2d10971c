"""The benchmark worker: one model's session load time, latency per batch and peak memory, in this process.

``python -m onnxsmith.runtime.latency`` reads a job (JSON on stdin: the model, the
provider, an .npz of inputs per batch size, runs, warm-up runs, threads, session
config entries) and prints the measurements as one JSON line. It is started afresh
for every model (:mod:`onnxsmith.release.bench`) so that no model's memory or caches
pollute another's numbers; it imports nothing of onnxsmith's but this module.
"""

from __future__ import annotations

import json
import sys

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def _proc_status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _rss_now() -> int:
    return _proc_status("VmRSS") or _peak_rss()


def _peak_rss() -> int:
    """This process's peak resident memory.

    Linux: VmHWM, which starts afresh at exec; ru_maxrss would carry over the peak of the
    forked parent (the whole build) into every benchmark process.
    """
    peak = _proc_status("VmHWM")
    if peak is not None:
        return peak
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def measure(job: dict) -> dict:
    import time

    import numpy as np
    import onnxruntime as ort

    providers = PROVIDERS[job["provider"]]
    if providers[0] not in ort.get_available_providers():
        return {"error": f"onnxruntime here has no {providers[0]} (it has {', '.join(ort.get_available_providers())})"}
    feeds = {int(b): dict(np.load(f)) for b, f in job["inputs"].items()}
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: an error comes back in the JSON report
    if job["threads"]:
        options.intra_op_num_threads = int(job["threads"])
    for key, value in job["config"].items():
        options.add_session_config_entry(key, value)
    rss_before = _rss_now()
    start = time.perf_counter()
    try:
        session = ort.InferenceSession(job["path"], sess_options=options, providers=providers)
    except Exception as err:  # onnxruntime's own exception types
        return {"error": f"onnxruntime cannot load the model: {_first_line(err)}"}
    load_ms = (time.perf_counter() - start) * 1000
    batches = []
    for batch, inputs in feeds.items():
        try:
            times = _time_runs(session, inputs, job["warmup"], job["runs"])
        except Exception as err:  # onnxruntime's own exception types; the other batch sizes may still run
            batches.append({"batch": batch, "error": f"onnxruntime failed to run it: {_first_line(err)}"})
            continue
        ms = np.array(times)
        batches.append(
            {
                "batch": batch,
                "runs": len(times),
                "median_ms": float(np.median(ms)),
                "p90_ms": float(np.percentile(ms, 90)),
                "mean_ms": float(ms.mean()),
                "min_ms": float(ms.min()),
            }
        )
    return {"load_ms": load_ms, "rss_before": rss_before, "peak_rss": _peak_rss(), "batches": batches}


def _time_runs(session, inputs: dict, warmup: int, runs: int) -> list[float]:
    import time

    for _ in range(warmup):
        session.run(None, inputs)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, inputs)
        times.append((time.perf_counter() - start) * 1000)
    return times


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.stdin.read()))))
