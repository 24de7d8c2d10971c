"""Several recipes built at once, one job per recipe on an execution engine (a Ray cluster's workers, or here).

Every recipe is read and checked before any is built (a bad one stops them all, as one bad recipe stops its
build), and their release folders must differ. A worker builds one recipe as ``onnxsmith build`` does, its
files written atomically into a staging folder and moved into place, so a worker lost mid-build leaves its
release as it was and the job runs again elsewhere. A recipe's own ``[execution]`` is not used inside a worker:
its validation runs in the worker's process (the cluster's CPUs are already the recipes'); its shard size and
shard folder still apply. A recipe whose build fails (a gate, a model that cannot be read) does not stop the
others: what became of each is returned.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from onnxsmith.core.errors import OnnxsmithError, UsageError
from onnxsmith.core.transform import Progress
from onnxsmith.execution.engine import Engine
from onnxsmith.release.build import build, default_out
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


@dataclass(frozen=True)
class RecipeBuilder:
    """What every worker holds: how to build (``bench``, ``force``); a job is (recipe path, release folder)."""

    bench: bool = True
    force: bool = False

    def __call__(self, job: tuple[str, str]) -> BuiltRecipe:
        path, out = job
        try:
            recipe = load_recipe(path)
            recipe = dataclasses.replace(
                recipe, execution=dataclasses.replace(recipe.execution, engine="local", address=None, workers=None)
            )
            result = build(recipe, out, bench=self.bench, force=self.force)
        except OnnxsmithError as err:
            return BuiltRecipe(path, out, error=err.one_line())
        return BuiltRecipe(
            path,
            out,
            published=tuple(o.variant.name for o in result.outcomes if o.published),
            failed=tuple((o.variant.name, o.reason) for o in result.failed),
        )


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
    """Every planned recipe built on ``engine``, one job each; the results in the recipes' order."""
    done: list[int] = []

    def arrived(index: int, result: BuiltRecipe) -> None:
        done.append(index)
        progress(f"built {len(done)}/{len(planned)} recipes ({Path(result.recipe).name}: {_status(result)})")

    progress(f"building {len(planned)} recipes on {engine.describe()}")
    jobs = [(os.fspath(r.path), os.fspath(target)) for r, target in planned]
    return engine.map(RecipeBuilder(bench, force), jobs, on_result=arrived)


def _status(result: BuiltRecipe) -> str:
    if result.error:
        return "stopped"
    return "every variant published" if not result.failed else f"{len(result.failed)} variant(s) refused"
