"""Several recipes built at once on an execution engine (a Ray cluster's workers, or here): a job per
(recipe, variant), then a job per recipe completing its release around the variants made.

Every recipe is read and checked, and every release folder locked and checked, before any is built (a bad one
stops them all, as one bad recipe stops its build); their release folders must differ. A variant is made and
judged as ``onnxsmith build`` makes it, into a folder of its own in its recipe's staging folder; the driver
moves the files of each into the staged release, a worker completes it (the source's ranges, the benchmark,
the card, the report) and the driver moves it into place, so a worker lost mid-job leaves every release as it
was and the job runs again elsewhere. Each worker keeps its last recipe prepared (the task's samples and the
source's outputs on them): a recipe's reference is run once per worker that makes one of its variants, not
once per variant. A recipe's own ``[execution]`` is not used inside a worker: its validation runs in the
worker's process (the cluster's CPUs are already the recipes'); its shard size and shard folder still apply.
A recipe whose build fails (a variant that cannot be made, a model that cannot be read) does not stop the
others: what became of each is returned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from onnxsmith.core.errors import OnnxsmithError, UsageError
from onnxsmith.core.transform import Progress
from onnxsmith.execution.engine import Engine, LocalEngine
from onnxsmith.release.build import (
    BuildResult,
    Prepared,
    VariantOutcome,
    default_out,
    finish,
    make_one_variant,
    outcome_line,
    prepare,
)
from onnxsmith.release.out_folder import StagedRelease, staged_release
from onnxsmith.release.recipe import Recipe, load_recipe


@dataclass(frozen=True)
class BuiltRecipe:
    """What became of one recipe: its release folder, the variants published and those refused (with why), or
    the one-line error that stopped its build."""

    recipe: str
    out: str
    published: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and not self.failed


class RecipeWorker:
    """What every worker holds: how to build (``bench``) and its last recipe prepared (the task's samples, the
    source's reference outputs once run), since a recipe's variants come one after another. A job is
    ``("variant", recipe path, variant index, folder)``: the variant made into that folder, or
    ``("finish", recipe path, release folder, outcomes)``: the release completed around its variants. An error
    that stops the recipe comes back as its one line."""

    def __init__(self, bench: bool = True) -> None:
        self.bench = bench
        self._held: tuple[str, Recipe, Prepared] | None = None

    def __getstate__(self) -> dict:
        return {"bench": self.bench, "_held": None}  # what it holds warm is its own

    def _prepared(self, path: str) -> tuple[Recipe, Prepared]:
        if self._held is None or self._held[0] != path:
            self._held = None  # the last recipe's samples let go first
            recipe = load_recipe(path)
            # Its validation runs in this worker's process: the cluster's CPUs are already the recipes'.
            local = dataclasses.replace(recipe.execution, engine="local", address=None, workers=None)
            recipe = dataclasses.replace(recipe, execution=local)
            self._held = (path, recipe, prepare(recipe, _quiet, _quiet, LocalEngine()))
        return self._held[1], self._held[2]

    def __call__(self, job: tuple) -> VariantOutcome | BuildResult | str:
        try:
            recipe, prepared = self._prepared(job[1])
            if job[0] == "variant":
                return make_one_variant(recipe, job[2], Path(job[3]), prepared, _quiet)
            return finish(recipe, Path(job[2]), prepared, job[3], _quiet, self.bench)
        except OnnxsmithError as err:
            return err.one_line()

    def close(self) -> None:
        self._held = None


def recipes_in(paths: list[str | os.PathLike[str]]) -> list[Path]:
    """The recipe files ``paths`` name: a file as given; a folder, its *.toml files and its subfolders'
    recipe.toml, sorted."""
    found: list[Path] = []
    for given in map(Path, paths):
        if given.is_dir():
            inside = sorted(given.glob("*.toml")) + sorted(given.glob("*/recipe.toml"))
            if not inside:
                raise UsageError("holds no recipe (*.toml, or a subfolder's recipe.toml)", given)
            found += inside
        else:
            found.append(given)
    return found


def plan_builds(paths: list[Path], out: Path | None) -> list[tuple[Recipe, Path]]:
    """Each recipe read and checked, with its release folder: ``out``/<its default name>, or its default."""
    recipes = [load_recipe(p) for p in paths]
    planned = [(r, (out / default_out(r.path).name) if out is not None else default_out(r.path)) for r in recipes]
    seen: dict[Path, Path] = {}
    for recipe, target in planned:
        if target.resolve() in seen:
            raise UsageError(
                f"and {seen[target.resolve()]} would both be built into {target}; name the recipes apart", recipe.path
            )
        seen[target.resolve()] = recipe.path
    return planned


def build_many(
    planned: list[tuple[Recipe, Path]],
    engine: Engine,
    *,
    bench: bool = True,
    force: bool = False,
    progress: Progress = lambda _: None,
) -> list[BuiltRecipe]:
    """Every planned recipe built on ``engine``: a job per (recipe, variant), then one per recipe completing its
    release; the results in the recipes' order. Every release folder is locked and checked first."""
    with contextlib.ExitStack() as stack:
        staged = [stack.enter_context(staged_release(recipe, out, force)) for recipe, out in planned]
        worker = RecipeWorker(bench)
        try:
            made = _variants(planned, staged, engine, worker, progress)
            finished = _finish(planned, staged, made, engine, worker, progress)
        finally:
            engine.release(worker)
        results = []
        for (recipe, out), stage, result in zip(planned, staged, finished):
            if isinstance(result, str):
                results.append(BuiltRecipe(os.fspath(recipe.path), os.fspath(out), error=result))
                continue
            stage.install()
            results.append(
                BuiltRecipe(
                    os.fspath(recipe.path),
                    os.fspath(out),
                    published=tuple(o.variant.name for o in result.outcomes if o.published),
                    failed=tuple((o.variant.name, o.reason) for o in result.failed),
                )
            )
    return results


def _variants(planned, staged: list[StagedRelease], engine: Engine, worker: RecipeWorker, progress: Progress):
    """Per recipe, its variants' outcomes with their files in its staging release, or the line that stopped it."""
    jobs = [  # absolute paths: a Ray worker's working folder is not the driver's
        ("variant", os.path.abspath(recipe.path), i, os.path.abspath(_part(stage, i)))
        for (recipe, _), stage in zip(planned, staged)
        for i in range(len(recipe.variants))
    ]
    done: list[int] = []

    def arrived(index: int, result: VariantOutcome | str) -> None:
        done.append(index)
        _, path, i, _ = jobs[index]
        what = result if isinstance(result, str) else outcome_line(result)
        progress(f"made {len(done)}/{len(jobs)} variants ({Path(path).parent.name}/{Path(path).name} #{i + 1}: {what})")

    progress(f"making {len(jobs)} variants of {len(planned)} recipes on {engine.describe()}")
    results = iter(engine.map(worker, jobs, on_result=arrived))
    made: list[list[VariantOutcome] | str] = []
    for (recipe, _), stage in zip(planned, staged):
        outcomes = [next(results) for _ in recipe.variants]
        stopped = next((o for o in outcomes if isinstance(o, str)), None)
        made.append(stopped if stopped is not None else [_moved_in(o, stage, i) for i, o in enumerate(outcomes)])
    return made


def _moved_in(outcome: VariantOutcome, stage: StagedRelease, index: int) -> VariantOutcome:
    """``outcome`` with its files moved from its part folder into the staging release."""
    part, release = Path(os.path.abspath(_part(stage, index))), Path(os.path.abspath(stage.release))
    for record in outcome.files:
        target = release / record.path.relative_to(part)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(record.path, target)
    return outcome.moved(part, release)


def _part(stage: StagedRelease, index: int) -> Path:
    """The folder a recipe's ``index``-th variant is made in, beside its staged release."""
    return stage.tmp / "parts" / str(index)


def _finish(planned, staged, made, engine: Engine, worker: RecipeWorker, progress: Progress):
    """Per recipe, its completed release's BuildResult, or the line that stopped it."""
    jobs = [
        ("finish", os.path.abspath(recipe.path), os.path.abspath(stage.release), outcomes)
        for (recipe, _), stage, outcomes in zip(planned, staged, made)
        if not isinstance(outcomes, str)
    ]
    done: list[int] = []

    def arrived(index: int, result: BuildResult | str) -> None:
        done.append(index)
        progress(f"completed {len(done)}/{len(jobs)} releases ({Path(jobs[index][1]).parent.name})")

    results = iter(engine.map(worker, jobs, on_result=arrived) if jobs else [])
    return [outcomes if isinstance(outcomes, str) else next(results) for outcomes in made]


def _quiet(_: str) -> None:
    pass
