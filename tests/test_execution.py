"""Where samples run: this process or a Ray cluster, in shards, resumable; the same numbers either way.

The Ray tests start a real cluster on 127.0.0.1 (a head that runs nothing and two one-CPU worker nodes, Ray's
own ``cluster_utils.Cluster``), validate a variant on 2,000 generated face crops there and here, and compare
the two results whole; one of them loses a worker node mid-run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import onnxsmith
from onnxsmith.core.errors import UsageError
from onnxsmith.execution.engine import LocalEngine, RayEngine, make_engine
from onnxsmith.execution.store import ShardStore, store_key
from onnxsmith.release.shards import shards_of
from onnxsmith.settings.execution import ExecutionOptions
from onnxsmith.tasks.base import Sample
from tests.conftest import assert_one_line_error
from tests.support.lm_models import TEXT, gpt2_folder
from tests.support.release import face_images, recipe_text, save_toy_faceage, wider_annotations

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "faceage_dynamo.onnx"
FACES = 2000


def _crops(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` small face-sized images of seeded noise over a smooth gradient (values the model resizes)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, 40)[None, :, None]
    for i in range(count):
        pixels = np.clip(ramp + rng.normal(0, 40, (48, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"face{i:05d}.png")
    return folder


@pytest.fixture(scope="module")
def faces(tmp_path_factory) -> Path:
    return _crops(tmp_path_factory.mktemp("faces"), FACES)


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """A face-age model as small as one can be (pooled colours to the two heads, a massive residual channel):
    validating it on thousands of faces costs what reading them costs, so the engines are what is timed."""
    return save_toy_faceage(tmp_path_factory.mktemp("toy") / "toy.onnx")


@pytest.fixture(scope="module")
def variant(tmp_path_factory, toy) -> Path:
    path = tmp_path_factory.mktemp("variant") / "fp16.onnx"
    onnxsmith.fp16(toy).save(path)
    return path


def _validate(source: Path, variant: Path, faces: Path, **execution) -> dict:
    """The validation's JSON but where it ran (which the engines say differently, and nothing else)."""
    validation = onnxsmith.validate(source, variant, task="faceage", data=faces, **execution)
    return {k: v for k, v in validation.to_json().items() if k != "ran_on"}


# ---- this process --------------------------------------------------------------------------------------------


class _Square:
    def __call__(self, job: int) -> int:
        return job * job


def test_local_engine_returns_results_in_job_order_and_reports_each():
    seen = []
    results = LocalEngine().map(_Square(), [3, 1, 2], on_result=lambda i, r: seen.append((i, r)))
    assert results == [9, 1, 4]
    assert seen == [(0, 9), (1, 1), (2, 4)]


def test_shards_are_whole_batches():
    samples = [Sample(str(i), {}) for i in range(10)]
    shards = shards_of(samples, shard_size=3, batch_size=2)
    assert [len(s) for s in shards] == [4, 4, 2]
    assert [s.id for shard in shards for s in shard] == [str(i) for i in range(10)]


def test_a_shard_store_reads_back_what_it_kept_and_skips_a_broken_file(tmp_path):
    store = ShardStore(tmp_path, store_key(model="m", samples=[1, 2]))
    outputs = [{"a/b": np.arange(3, dtype=np.float32)}, {"a/b": np.ones(3, dtype=np.float32)}]
    store.save(4, outputs)
    back = store.load(4)
    assert back is not None and len(back) == 2
    np.testing.assert_array_equal(back[1]["a/b"], outputs[1]["a/b"])
    assert store.load(5) is None
    (store.folder / "shard-00004.npz").write_bytes(b"not an npz")
    assert store.load(4) is None  # run again rather than trusted
    assert store_key(model="m", samples=[1, 2]) != store_key(model="m", samples=[1, 3])


def test_workers_without_ray_is_refused():
    with pytest.raises(UsageError, match="workers are Ray's"):
        make_engine(ExecutionOptions(workers=2))


def test_ray_missing_says_how_to_install_it(tmp_path, toy, variant):
    # Ray hidden from the command (an import of a module set to None fails), as on a machine without it.
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from onnxsmith.cli.main import main\n"
        f"sys.exit(main(['validate', {str(toy)!r}, {str(variant)!r}, '--task', 'faceage', '--data', "
        f"{str(tmp_path)!r}, '--engine', 'ray']))\n"
    )
    _crops(tmp_path, 2)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert_one_line_error(result, "pip install 'onnxsmith[ray]'")


@pytest.mark.slow
def test_a_rerun_with_kept_shards_reads_them_back(tmp_path, toy, variant):
    small = _crops(tmp_path / "faces", 96, seed=1)
    first = _validate(toy, variant, small, shard_size=32, shard_dir=tmp_path / "shards")
    kept = sorted((tmp_path / "shards").rglob("shard-*.npz"))
    assert len(kept) == 6  # 3 shards of each model
    times = {p: p.stat().st_mtime_ns for p in kept}
    kept[1].unlink()  # as if the run had stopped before this shard
    again = _validate(toy, variant, small, shard_size=32, shard_dir=tmp_path / "shards")
    assert again == first
    assert kept[1].is_file()
    assert all(p.stat().st_mtime_ns == t for p, t in times.items() if p != kept[1])  # read back, not run
    # An edited image is a different key: run again, not read back.
    Image.new("RGB", (40, 48), (250, 10, 10)).save(small / "face00000.png")
    edited = _validate(toy, variant, small, shard_size=32, shard_dir=tmp_path / "shards")
    assert edited["rows"][0] != first["rows"][0]
    assert len(list((tmp_path / "shards").iterdir())) == 4  # two new keys beside the two first


# ---- a Ray cluster on 127.0.0.1 ------------------------------------------------------------------------------


#: Ray's name for its workers' niceness (ray_constants.RAY_WORKER_NICENESS).
WORKER_NICENESS = "RAY_worker_niceness"


@pytest.fixture(scope="module")
def cluster():
    """Ray's own test cluster, on the loopback address only: Ray takes a Linux machine's outward address
    unless told that clusters are not for this machine (its switch for Windows and macOS), which must be said
    before Ray is imported."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ[WORKER_NICENESS] = "0"  # Ray's workers niced would starve beside the suite's other worker
    import ray  # installed by the test setup (pyproject.toml's dev extra)
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [made.add_node(num_cpus=1) for _ in range(2)]
    assert made.address.startswith("127.0.0.1:")
    ray.init(address=made.address, log_to_driver=False)
    yield made, workers
    ray.shutdown()
    made.shutdown()
    del os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"], os.environ[WORKER_NICENESS]


class _DiesOnce:
    """Squares; the first time it meets job 3 its process exits, as a killed worker's would."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __call__(self, job: int) -> tuple[int, int]:
        if job == 3 and not self.marker.exists():
            self.marker.write_text("died")
            os._exit(1)
        return job * job, os.getpid()


@pytest.mark.slow
def test_ray_engine_runs_a_lost_job_again_and_keeps_job_order(cluster, tmp_path):
    made, _ = cluster
    with RayEngine(made.address, workers=2) as engine:
        results = engine.map(_DiesOnce(tmp_path / "marker"), list(range(8)))
    assert [r for r, _ in results] == [j * j for j in range(8)]
    assert (tmp_path / "marker").read_text() == "died"
    with RayEngine(made.address, workers=5) as engine:  # more than the cluster's CPUs would wait forever
        assert engine.workers == 2


@pytest.mark.slow
def test_validation_on_ray_equals_this_process_even_when_a_worker_is_lost(cluster, toy, variant, faces):
    made, workers = cluster
    here = _validate(toy, variant, faces, shard_size=100)
    assert here["samples"] == FACES
    assert here["rows"][0]["sample"] == "face00000.png" and len(here["rows"]) == FACES
    spread = _validate(toy, variant, faces, address=made.address, workers=2, shard_size=100)
    assert spread == here  # every metric, row and histogram, digit for digit

    # A worker node is removed when a quarter of the variant's samples are done; the other finishes its share.
    removed = []

    def progress(line: str) -> None:
        if "running fp16.onnx:" in line and not removed:
            done = int(line.split(": ")[-1].split("/")[0])
            if done >= FACES // 4:
                made.remove_node(workers[1])
                removed.append(done)

    validation = onnxsmith.validate(
        toy, variant, task="faceage", data=faces, address=made.address, workers=2, shard_size=100, progress=progress
    )
    workers[1] = made.add_node(num_cpus=1)  # the cluster as it was, for the tests after this one
    assert removed, "the run ended before a worker could be lost"
    assert {k: v for k, v in validation.to_json().items() if k != "ran_on"} == here
    assert (
        validation.ran_on
        == "20 shard(s) of up to 104 samples (whole batches of 8) on 2 worker(s) on the Ray cluster at " + made.address
    )


def test_validate_help_lists_where_samples_run():
    result = subprocess.run(
        [sys.executable, "-m", "onnxsmith", "validate", "--task", "faceage", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for flag in ("--engine {local,ray}", "--ray ADDRESS", "--workers", "--shard-size", "--shard-dir DIR"):
        assert flag in result.stdout


@pytest.mark.slow
def test_a_folder_of_input_sets_is_read_where_its_shards_run_and_judged_the_same_on_ray(
    cluster, tmp_path, toy, variant, faces
):
    from onnxsmith.io.load import load_model
    from onnxsmith.tasks import get_task

    made, _ = cluster
    sets = _calibration(tmp_path / "sets", faces, 300, model=toy)
    task = get_task("generic")
    refs = task.sample_refs(load_model(toy), task.Options(data=str(sets)), toy)
    assert len(refs) == 300 and all(not r.feeds for r in refs)  # the driver holds where each set is, not it

    def judged(**execution) -> dict:
        validation = onnxsmith.validate(toy, variant, task="generic", data=sets, shard_size=50, **execution)
        return {k: v for k, v in validation.to_json().items() if k != "ran_on"}

    here = judged()
    assert here["samples"] == 300 and here["data"].startswith("300 input set(s) from sets")
    assert judged(address=made.address, workers=2) == here


# ---- several recipes -----------------------------------------------------------------------------------------


def _recipes(root: Path, names: tuple[str, ...]) -> Path:
    """One folder per name under ``root``, each with a toy face-age model, three faces and a recipe.toml
    (two fp16 variants), as `onnxsmith build` takes them."""
    for i, name in enumerate(names):
        folder = root / name
        folder.mkdir(parents=True)
        source = save_toy_faceage(folder / "toy.onnx", seed=i)
        images = face_images(folder / "images", count=3)
        (folder / "images" / "boxes.txt").write_text(wider_annotations([(n, [b]) for n, b in images]))
        variants = (
            '[[variants]]\nname = "fp16"\nsteps = [{ transform = "fp16" }]\n\n'
            '[[variants]]\nname = "fp16-io"\nsteps = [{ transform = "fp16", keep_io_types = false }]\n'
        )
        validation = '[validation]\ntask = "faceage"\ndata = "images"\nboxes = "images/boxes.txt"\n'
        (folder / "recipe.toml").write_text(recipe_text(source, variants, validation=validation))
    return root


def _releases(out: Path) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in sorted(out.glob("*/SHA256SUMS"))}


@pytest.mark.slow
def test_several_recipes_build_one_release_each_the_same_here_and_on_ray(cluster, tmp_path, monkeypatch):
    made, _ = cluster
    root = _recipes(tmp_path / "recipes", ("alpha", "beta", "gamma"))
    here = onnxsmith.build_all([root], tmp_path / "here", bench=False)
    assert [Path(r.out).name for r in here] == ["alpha", "beta", "gamma"]
    assert all(r.published and not r.error for r in here), here
    # A job per (recipe, variant), then per release; paths relative to here (a Ray worker works elsewhere).
    monkeypatch.chdir(tmp_path)
    lines: list[str] = []
    spread = onnxsmith.build_all(
        ["recipes"], "ray", bench=False, address=made.address, workers=2, progress=lines.append
    )
    assert sum(line.startswith("made ") for line in lines) == 6
    assert sum(line.startswith("completed ") for line in lines) == 3
    assert [(r.published, r.failed, r.error) for r in spread] == [(r.published, r.failed, r.error) for r in here]
    assert _releases(tmp_path / "ray") == _releases(tmp_path / "here")  # the same files, byte for byte
    assert len(_releases(tmp_path / "here")) == 3


def test_several_recipes_are_all_checked_before_any_is_built(tmp_path):
    root = _recipes(tmp_path / "recipes", ("alpha", "beta"))
    (root / "beta" / "recipe.toml").write_text((root / "beta" / "recipe.toml").read_text() + "\nnot toml [\n")
    result = subprocess.run(
        [sys.executable, "-m", "onnxsmith", "build", str(root), "--out", str(tmp_path / "out"), "--no-bench"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_line_error(result, "beta/recipe.toml")
    assert not (tmp_path / "out").exists()  # alpha was not built either


def test_two_recipes_that_would_build_into_one_folder_are_refused(tmp_path):
    root = _recipes(tmp_path / "a", ("same",))
    other = _recipes(tmp_path / "b", ("same",))
    with pytest.raises(UsageError, match="would both be built into"):
        onnxsmith.build_all([root / "same" / "recipe.toml", other / "same" / "recipe.toml"], tmp_path / "out")


def test_build_of_a_folder_of_recipes_prints_what_became_of_each(tmp_path):
    root = _recipes(tmp_path / "recipes", ("alpha", "beta"))
    result = subprocess.run(
        [sys.executable, "-m", "onnxsmith", "build", str(root), "--out", str(tmp_path / "out"), "--no-bench"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "releases" in result.stdout and "not published" in result.stdout
    assert sorted(_releases(tmp_path / "out")) == ["alpha", "beta"]


# ---- calibration statistics in shards ------------------------------------------------------------------------


def _calibration(folder: Path, faces: Path, count: int, model: Path = FIXTURE) -> Path:
    """``count`` input sets of ``model`` (a face-age one) as .npz files (`--calib DIR`): faces as the task feeds
    them."""
    from onnxsmith.io.load import load_model
    from onnxsmith.tasks import get_task

    task = get_task("faceage")
    options = task.Options(data=str(faces), limit=count)
    folder.mkdir()
    for sample in task.samples(load_model(model), options, model):
        np.savez(folder / f"{sample.id}.npz", **sample.feeds)
    return folder


def test_statistics_in_shards_are_those_of_every_input_set_at_once(tmp_path, faces):
    from onnxsmith.int8_engine import statistics

    calibration = _calibration(tmp_path / "calib", faces, 40)
    feeds = [dict(np.load(p)) for p in sorted(calibration.iterdir())]
    assert len(feeds) > 2 * statistics.SHARD  # three shards, the last one short
    sharded = statistics.measure_inputs(FIXTURE, feeds)
    whole = {}
    for shard_of_one in feeds:  # every set its own shard: the maxima cannot depend on how sets are grouped
        for name, stats in statistics.measure_inputs(FIXTURE, [shard_of_one]).items():
            whole[name] = stats.channel_absmax if name not in whole else np.maximum(whole[name], stats.channel_absmax)
    assert sharded.keys() == whole.keys()
    for name, stats in sharded.items():
        np.testing.assert_array_equal(stats.channel_absmax, whole[name])
    linear = next(iter(sharded))
    (_, gram), *_ = statistics.input_grams(FIXTURE, feeds, {linear})
    parts = [next(statistics.input_grams(FIXTURE, feeds[i : i + 8], {linear}))[1] for i in range(0, 40, 8)]
    np.testing.assert_allclose(gram, sum(parts), rtol=1e-12)  # sums over shards: the sum over every set


@pytest.mark.slow
def test_int8_calibrated_on_ray_is_the_same_variant_byte_for_byte_even_when_a_worker_is_lost(cluster, tmp_path, faces):
    made, workers = cluster
    calibration = _calibration(tmp_path / "calib", faces, 40)
    options = {"feeds": str(calibration), "compensate_rounding": True, "speed": False}
    here = onnxsmith.int8(FIXTURE, **options).save(tmp_path / "here.onnx")
    spread = onnxsmith.int8(FIXTURE, **options, address=made.address, workers=2).save(tmp_path / "ray.onnx")
    assert [f.sha256 for f in spread] == [f.sha256 for f in here]

    # A worker node is removed when the first shard of the first statistic is in: the same bytes still.
    removed = []

    def progress(line: str) -> None:
        if line.endswith(" shards of 16 input sets") and not removed:
            made.remove_node(workers[1])
            removed.append(line)

    lost = onnxsmith.int8(FIXTURE, **options, address=made.address, workers=2, progress=progress)
    workers[1] = made.add_node(num_cpus=1)  # the cluster as it was, for the tests after this one
    assert removed and removed[0].startswith("int8: measuring the inputs of ")
    assert [f.sha256 for f in lost.save(tmp_path / "lost.onnx")] == [f.sha256 for f in here]

    # The Convs' ranges (this model's one Conv stays fp32, too small a share to be worth it): the same too.
    from onnxsmith.int8_engine import statistics
    from onnxsmith.io.load import load_model

    feeds = [dict(np.load(p)) for p in sorted(calibration.iterdir())]
    conv = next(n for n in load_model(FIXTURE).graph if n.op_type == "Conv")
    names = {conv.inputs[0].name, conv.outputs[0].name}
    with RayEngine(made.address, workers=2) as engine:
        on_ray = statistics.measure_ranges(FIXTURE, feeds, names, engine=engine)
    assert on_ray == statistics.measure_ranges(FIXTURE, feeds, names) and on_ray.keys() == names


@pytest.mark.slow
def test_fp16_calibrated_on_ray_is_the_same_variant_byte_for_byte(cluster, tmp_path, faces):
    from onnxsmith.probes.ranges import SHARD, measure_ranges

    made, _ = cluster
    calibration = _calibration(tmp_path / "calib", faces, 2 * SHARD + 3)
    feeds = [dict(np.load(p)) for p in sorted(calibration.iterdir())]
    with RayEngine(made.address, workers=2) as engine:
        outputs_ray: dict = {}
        on_ray = measure_ranges(FIXTURE, feeds, outputs=outputs_ray, derive_movement=True, engine=engine)
    outputs_here: dict = {}
    assert on_ray == measure_ranges(FIXTURE, feeds, outputs=outputs_here, derive_movement=True)
    assert outputs_ray.keys() == outputs_here.keys()
    for name, value in outputs_here.items():
        np.testing.assert_array_equal(outputs_ray[name], value)
    here = onnxsmith.fp16(FIXTURE, feeds=str(calibration)).save(tmp_path / "here.onnx")
    spread = onnxsmith.fp16(FIXTURE, feeds=str(calibration), address=made.address).save(tmp_path / "ray.onnx")
    assert [f.sha256 for f in spread] == [f.sha256 for f in here]


# ---- a language model on held-out text -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_fp16(tmp_path_factory) -> tuple[Path, Path]:
    source = gpt2_folder(past=False) / "onnx" / "model.onnx"
    variant = tmp_path_factory.mktemp("gpt2") / "fp16.onnx"
    onnxsmith.fp16(source).save(variant)
    return source, variant


def _validate_lm(source: Path, variant: Path, **execution) -> dict:
    validation = onnxsmith.validate(
        source, variant, task="lm", text=TEXT, window=32, max_windows=24, batch=2, **execution
    )
    return validation.to_json()


def test_lm_windows_kept_in_shards_are_read_back_on_a_rerun(tmp_path, gpt2_fp16):
    source, variant = gpt2_fp16
    whole = _validate_lm(source, variant)
    kept = _validate_lm(source, variant, shard_size=5, shard_dir=tmp_path / "shards")
    (store,) = (tmp_path / "shards").iterdir()
    assert len(list(store.glob("shard-*.npz"))) == 4  # 24 windows in shards of 6 (whole batches of 2)
    assert whole["ran_on"] == "1 shard(s) of up to 24 samples (whole batches of 2) on this process"
    assert {k: v for k, v in kept.items() if k != "ran_on"} == {k: v for k, v in whole.items() if k != "ran_on"}
    for shard in sorted(store.glob("shard-*.npz"))[1:]:
        shard.unlink()  # an interrupted run: the first shard done
    lines: list[str] = []
    again = onnxsmith.validate(
        source,
        variant,
        task="lm",
        text=TEXT,
        window=32,
        max_windows=24,
        batch=2,
        shard_size=5,
        shard_dir=tmp_path / "shards",
        progress=lines.append,
    )
    assert again.to_json() == kept
    assert "windows 12/24" in lines and "windows 6/24" not in lines  # the kept shard was not run again


@pytest.mark.slow
def test_lm_validation_on_ray_equals_this_process(cluster, gpt2_fp16):
    made, _ = cluster
    source, variant = gpt2_fp16
    here = _validate_lm(source, variant, shard_size=6)
    spread = _validate_lm(source, variant, shard_size=6, address=made.address, workers=2)
    assert here["samples"] == 24 and here["metrics"]
    assert spread.pop("ran_on").endswith("on 2 worker(s) on the Ray cluster at " + made.address)
    here.pop("ran_on")
    assert spread == here  # every metric, digit for digit
