"""The two engines: this process, or the actors of a Ray cluster.

``engine.map(worker, jobs)`` returns ``[worker(job) for job in jobs]``. A worker is built once by the caller and
copied to each place that runs jobs, where it stays warm between them (a validation worker keeps its onnxruntime
sessions open), so it must pickle. ``on_result(index, result)`` is called as each job finishes, in whatever
order they finish: what to keep (the shard store) is kept at once; the list returned is in job order.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from onnxsmith.core.errors import OnnxsmithError, UsageError
from onnxsmith.settings.execution import EngineOptions

#: Ray's name for its workers' niceness (ray_constants.RAY_WORKER_NICENESS), read by the cluster it starts.
WORKER_NICENESS = "RAY_worker_niceness"
#: How often one job may lose its worker (a killed process, a node gone) before the run gives up.
RETRIES = 3

Worker = Callable[[Any], Any]
OnResult = Callable[[int, Any], None]


class ExecutionError(OnnxsmithError):
    """Work could not be finished where it ran (its workers kept dying)."""


class Engine:
    """Runs jobs; see the module docstring. A context manager: leaving it releases what it started."""

    name = "local"

    def map(self, worker: Worker, jobs: Sequence[Any], *, on_result: OnResult | None = None) -> list[Any]:
        raise NotImplementedError

    def describe(self) -> str:
        return "this process"

    def release(self, worker: Worker) -> None:
        """``worker`` is done with: what it holds warm (sessions, mapped weights) is let go."""
        close = getattr(worker, "close", None)
        if close is not None:
            close()

    def close(self) -> None:
        pass

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalEngine(Engine):
    """Every job in this process, one after another: the worker stays warm across jobs and maps."""

    def map(self, worker: Worker, jobs: Sequence[Any], *, on_result: OnResult | None = None) -> list[Any]:
        results = []
        for index, job in enumerate(jobs):
            result = worker(job)
            if on_result is not None:
                on_result(index, result)
            results.append(result)
        return results


class _Actor:
    """What a Ray actor holds: one worker, warm across the jobs sent to it."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def run(self, job: Any) -> Any:
        return self.worker(job)


class RayEngine(Engine):
    """Jobs on the actors of a Ray cluster: one actor per worker slot (one CPU each), a job at a time per actor.

    A job whose actor dies (its process killed, its node gone) runs again on another actor, up to
    :data:`RETRIES` times; the lost actor's slot is dropped, so the survivors take its share and nothing waits
    for CPUs the cluster no longer has (a fresh actor is started only when none is left), and a later map's
    pool is no larger than the survivors (the cluster may count a lost node's CPUs a while). An exception the
    worker raises (a file it cannot read) is raised here, as it would be locally.
    """

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        """``address``: the cluster to join (None: start one on this machine)."""
        try:
            import ray
        except ImportError:
            raise UsageError("--ray needs Ray, which is not installed: pip install 'onnxsmith[ray]'") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            # No address: start a cluster on this machine; else join the one there. Ray's own INFO lines
            # (and its workers' output) would be interleaved with onnxsmith's: warnings only.
            if address is None:
                # The workers of a cluster started for this run are its work: at the priority of the run, not
                # Ray's default niceness, which starves them whenever anything else is busy.
                os.environ.setdefault(WORKER_NICENESS, "0")
            ray.init(
                # "local": always a new cluster here; None would join whatever RAY_ADDRESS or the last
                # `ray start` on this machine names (a test's cluster, someone else's).
                address=address or "local",
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=True,
            )
        self.address = address
        # One CPU an actor: more workers than the cluster has CPUs would leave the rest waiting for CPUs that
        # never free (each actor holds its own for good), and a job sent to one of them would never return.
        self._asked = workers
        self._survivors: int | None = None  # workers left after the last loss
        self.workers = self._slots()
        self._remote = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_Actor)
        self._pools: dict[int, tuple[Worker, list[Any]]] = {}

    def describe(self) -> str:
        where = "a Ray cluster started here" if self.address is None else f"the Ray cluster at {self.address}"
        return f"{self.workers} worker(s) on {where}"

    def _slots(self) -> int:
        """Workers a new pool gets: as many as asked (default: one per CPU of the cluster), no more than the
        cluster's CPUs, nor than survived the last loss (a lost node's CPUs may still be counted for a while)."""
        cpus = max(1, int(self._ray.cluster_resources().get("CPU", 1)))
        slots = min(self._asked, cpus) if self._asked else cpus
        return slots if self._survivors is None else min(slots, self._survivors)

    def _pool(self, worker: Worker) -> list[Any]:
        """The actors holding ``worker``: made on its first map, kept warm for the next."""
        if id(worker) not in self._pools:
            self._pools[id(worker)] = (worker, [self._actor(worker) for _ in range(self._slots())])
        return self._pools[id(worker)][1]

    def _actor(self, worker: Worker) -> Any:
        """An actor holding ``worker``, told it has one CPU (``with_threads``, where it has it): two workers on
        one machine each running a thread per core would fight over the cores."""
        placed = getattr(worker, "with_threads", None)
        return self._remote.remote(placed(1) if placed is not None else worker)

    def map(self, worker: Worker, jobs: Sequence[Any], *, on_result: OnResult | None = None) -> list[Any]:
        ray = self._ray
        lost_worker = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)
        actors = self._pool(worker)
        pending = collections.deque(range(len(jobs)))
        losses: collections.Counter[int] = collections.Counter()
        results: list[Any] = [None] * len(jobs)
        running: dict[Any, tuple[Any, int]] = {}  # a job's future -> (its actor, the job's index)

        def start(actor: Any) -> None:
            index = pending.popleft()
            running[actor.run.remote(jobs[index])] = (actor, index)

        for actor in actors[: len(pending)]:
            start(actor)
        while running:
            (future,), _ = ray.wait(list(running), num_returns=1)
            actor, index = running.pop(future)
            try:
                result = ray.get(future)
            except lost_worker:
                losses[index] += 1
                if losses[index] > RETRIES:
                    raise ExecutionError(f"shard {index} lost its worker {losses[index]} times; giving up") from None
                if actor in actors:
                    actors.remove(actor)
                    self._survivors = max(1, len(actors))  # the next pool no larger: its CPUs may be gone
                pending.appendleft(index)
                if not actors:  # every worker lost: start one again (the cluster may have recovered)
                    actors.append(self._actor(worker))
                idle = [a for a in actors if all(a is not b for b, _ in running.values())]
                for spare in idle[: len(pending)]:
                    start(spare)
                continue
            except ray.exceptions.RayTaskError as err:
                cause = err.cause
                if isinstance(cause, BaseException):
                    raise cause from None
                raise
            results[index] = result
            if on_result is not None:
                on_result(index, result)
            if pending:
                start(actor)
        return results

    def release(self, worker: Worker) -> None:
        """The actors holding ``worker`` stopped (a measurement's workers are not kept for the next one)."""
        _, actors = self._pools.pop(id(worker), (None, []))
        for actor in actors:
            self._ray.kill(actor)

    def close(self) -> None:
        for _, actors in self._pools.values():
            for actor in actors:
                self._ray.kill(actor)
        self._pools.clear()
        if self._started:
            self._ray.shutdown()


def make_engine(options: EngineOptions) -> Engine:
    """The engine ``options`` name: a Ray cluster's, else this process."""
    if options.on_ray:
        return RayEngine(options.address, options.workers)
    if options.workers:
        raise UsageError("workers are Ray's (--ray ADDRESS or --engine ray): this process runs every shard itself")
    return LocalEngine()


class Progress:
    """Samples done of a total, their rate and the time left, as one line for a status display."""

    def __init__(self, total: int, report: Callable[[str], None], what: str) -> None:
        self.total, self.report, self.what = total, report, what
        self.done = 0
        self._start = time.monotonic()

    def add(self, count: int) -> None:
        self.done += count
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta = f", {left:.0f} s left" if self.done < self.total else ""
        self.report(f"{self.what}: {self.done}/{self.total} samples, {rate:.1f}/s{eta}")
