"""onnxsmith as a library: every command as a call, verified exactly like the command.

::

    import onnxsmith
    v = onnxsmith.fp16("model.onnx", samples=4)   # a Variant: made and verified, nothing written yet
    v.ok, v.report.headline, v.comparison          # the verdict, what was achieved and why not more, the metrics
    v.save("model_fp16.onnx")                      # atomic; the bytes the CLI writes for the same options

A model is a path, an ``onnx_ir.Model`` or an ``onnx.ModelProto`` (written to a private
file first, which the provenance says). Each call takes its transform's options as keyword
arguments (the Options dataclasses of :mod:`onnxsmith.transforms`, the same definitions as
the CLI flags and the recipe keys) and the inputs it calibrates and verifies on:

* ``feeds``: input sets — a ``{name: array}`` dict, a list of them, or the path of an .npz
  (one set) or of a folder of .npz files (one set each), or of a folder of images, audio (.wav) or
  text (.txt) made into input sets through what each input is (runtime/data_folder.py: one file each);
* ``input_role``: corrections of what an input is (``["x=NHWC,0..255"]``, docs/inputs.md), for made-up
  inputs and for a folder of files;
* else ``samples`` random sets from the model's input spec, seeded from ``seed``, sized by
  ``shape`` (``{"x": (1, 3, 224, 224)}`` for an input, ``{"batch": 2}`` for a named dim).

A variant waits in a private folder (beside ``out`` when given, so its save is a rename;
else in the system's temporary folder) until :meth:`Variant.save`; one never saved is
removed when it is closed (``with``) or garbage-collected. The CLI (:mod:`onnxsmith.cli`)
is argparse and printing over these calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxsmith.analysis.input_roles import (
    CONDITION,
    InputRole,
    describe_inputs,
    guessed_ranges,
    parse_role_options,
    plausible,
    ranges_alike,
    unlike_real,
)
from onnxsmith.analysis.lm_signature import cache_layout
from onnxsmith.analysis.summary import ModelSummary, summarize
from onnxsmith.core import options as opts
from onnxsmith.core.errors import GateFailed, UsageError
from onnxsmith.execution.engine import make_engine
from onnxsmith.io.files import FileRecord, PrivateFolder, write_text_atomic
from onnxsmith.io.load import files_read_by, load_model, source_files
from onnxsmith.io.paths import check_outputs as _check_outputs
from onnxsmith.io.save import save_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.release.bench import BenchRun, BenchSettings, bench_models
from onnxsmith.release.extract import make_piece
from onnxsmith.release.lm_folder import StagedFolder, source_model, stage_folder
from onnxsmith.release.validate import TaskRun, Validation, check_gates
from onnxsmith.release.variant import Source, StagedVariant, Staging, VariantReport, Verification, make_variant
from onnxsmith.runtime import runner
from onnxsmith.runtime.data_folder import describe_data, load_data
from onnxsmith.runtime.inputs import (
    adapt_feeds,
    input_specs,
    parse_shape_options,
    unlike_first,
)
from onnxsmith.runtime.runner import prepare_session
from onnxsmith.runtime.sizing import inputs_that_run
from onnxsmith.settings.bench import BenchOptions
from onnxsmith.settings.execution import EngineOptions, ExecutionOptions
from onnxsmith.settings.gate import GateOptions
from onnxsmith.settings.inputs import InputOptions
from onnxsmith.tasks import get_task, lm
from onnxsmith.tasks.widerface import box_problem
from onnxsmith.transforms import get_transform
from onnxsmith.transforms.quantize import QuantizeOptions
from onnxsmith.verify.compare import Comparison, compare_models

#: What a call takes where a model is meant.
ModelLike = str | os.PathLike | ir.Model | onnx.ModelProto
#: Input sets: one ``{input name: array}``, several, or an .npz file / a folder of .npz files.
Feeds = Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | str | os.PathLike
#: Sizes for random inputs: ``{"input": (d0, d1, ...)}`` or ``{"dim_name": n}``, or CLI-style strings.
Shape = Mapping[str, int | Sequence[int]] | Sequence[str]
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class UnknownKeyword(UsageError, TypeError):
    """A call got a keyword that is neither one of its parameters nor an option of its transform."""


# ---------------------------------------------------------------------------------------------
# Results


#: What a call did and measured, headline first (one record for a variant staged, saved or published).
Report = VariantReport


class _Staged:
    """Files made and verified, waiting in a private folder: saved once asked, removed when dropped."""

    def __init__(self, staged: StagedVariant | StagedFolder, cleanup: list[PrivateFolder]) -> None:
        self._staged = staged
        self._saved: list[FileRecord] | None = None
        # Removed when the object is closed or collected, or at exit: a variant never saved leaves nothing.
        self._finalizer = weakref.finalize(self, _close_all, [staged.folder, *cleanup])

    @property
    def ok(self) -> bool:
        """Whether it passed its gate (a refused one is saved only with ``force=True``)."""
        return self._staged.passed

    @property
    def failure(self) -> str | None:
        """Why the gate refused it (one line), None when it passed."""
        return self._staged.failure

    @property
    def files(self) -> list[FileRecord] | None:
        """What the last :meth:`save` wrote (paths, bytes, sha256), None before it."""
        return self._saved

    def save(
        self, path: str | os.PathLike | None = None, *, force: bool = False, report: str | os.PathLike | None = None
    ) -> list[FileRecord]:
        """Write it to ``path`` (default: the ``out`` it was made for), atomically; return what was written.

        ``report``: also write :meth:`to_json` there, committed with the files: a report that cannot
        be written (a full disk) leaves nothing saved.

        A variant that failed its gate is refused (:class:`GateFailed`) unless ``force``. The
        output is checked as the CLI checks it: never a file the source reads, a regular file
        (a folder for ``quantize``) in a writable place. The first save moves the staged files;
        a later one copies what the first wrote.
        """
        where = path if path is not None else self._staged_for()
        if not self.ok and not force:
            raise GateFailed(f"{self.failure}; save(force=True) writes it anyway", where)
        if self._finalizer.alive is False and self._saved is None:
            raise UsageError("the variant was closed before it was saved; make it again")
        alongside = None if report is None else (report, self._report_text)
        self._saved = self._commit(path, alongside)
        return self._saved

    def close(self) -> None:
        """Remove the staged files (what was saved stays where it was saved)."""
        self._finalizer()

    def to_json(self) -> dict:
        """What the CLI's ``--report`` writes: what was done, the gate's measurements, the files saved. A refused
        one's starts with ``"refused"``: why (what the CLI writes for ``--report`` when the gate refuses)."""
        return self._verdict(self._json(self._saved or []))

    def write_report(self, path: str | os.PathLike) -> FileRecord:
        """Write :meth:`to_json` to ``path`` atomically (what the CLI's ``--report`` writes; ``save(report=)``
        writes it with the files)."""
        return write_text_atomic(path, self._report_text(self._saved or []))

    def _report_text(self, files: list[FileRecord]) -> str:
        """:meth:`to_json` as the report file holds it, ``files`` the ones saved."""
        return json.dumps(self._verdict(self._json(files)), indent=2, default=str) + "\n"

    def _verdict(self, data: dict) -> dict:
        # A refused one's report keeps the measurements that refused it (what a user decides on), and says so
        # first: it is never taken for the report of something written.
        return data if self.ok else {"refused": self.failure, **data}

    def _json(self, files: list[FileRecord]) -> dict:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _staged_for(self) -> Path | None:
        raise NotImplementedError

    def _commit(self, path: str | os.PathLike | None, alongside=None) -> list[FileRecord]:
        raise NotImplementedError


def _close_all(folders: list[PrivateFolder]) -> None:
    for folder in folders:
        folder.close()


class Variant(_Staged):
    """A model made from a source and verified against it; nothing written until :meth:`save`.

    ``ok`` (the gate's verdict), ``report`` (:class:`Report`: headline, what each transform
    did), ``comparison`` (the gate's metrics as data: one :class:`~onnxsmith.verify.compare.OutputDiff`
    per output), ``path`` (a file holding it now, to run it before saving).
    """

    _staged: StagedVariant

    def __init__(self, staged: StagedVariant, cleanup: list[PrivateFolder] = ()) -> None:
        super().__init__(staged, list(cleanup))
        self.report: Report = staged.report
        self.comparison: Comparison = staged.report.comparison

    @property
    def path(self) -> Path:
        """Where its .onnx is now: staged, or where it was last saved."""
        return self._staged.staged.path

    def _staged_for(self) -> Path | None:
        return self._staged.staged.final

    def _commit(self, path, alongside=None) -> list[FileRecord]:
        return self._staged.commit(path, alongside=alongside)

    def _json(self, files: list[FileRecord]) -> dict:
        return {
            **self.report.to_json(),
            "files": [f.to_json() for f in files],
            "verification": self.comparison.to_json(),
        }

    def __repr__(self) -> str:
        return f"<onnxsmith.{type(self).__name__} {'; '.join(self.report.headline[:2])}>"


class Piece(Variant):
    """A subgraph made a model of its own (``extract``): a :class:`Variant` whose inputs and outputs differ.

    ``inputs``/``outputs``: the piece's, as ``{"name", "dtype", "dims"}``; ``report.steps[0].stats``
    holds the initializers kept and the tensors typed by running the source.
    """

    @property
    def inputs(self) -> list[dict]:
        return self.report.steps[0].stats["io"]["inputs"]

    @property
    def outputs(self) -> list[dict]:
        return self.report.steps[0].stats["io"]["outputs"]

    def _json(self, files: list[FileRecord]) -> dict:
        [step] = self.report.steps
        return {
            "headline": self.report.headline,
            "source": self.report.source.to_json(),
            "files": [f.to_json() for f in files],
            "nodes": {"source": self.report.nodes_before, "piece": self.report.nodes_after},
            "initializers": step.stats["initializers"],
            "typed_by_running": step.stats["typed_by_running"],
            "notes": step.notes,
            "io": step.stats["io"],
            "verification": self.comparison.to_json(),
        }


class QuantizedFolder(_Staged):
    """A language model's folder with quantized weights (``quantize``); nothing written until :meth:`save`.

    ``variants``: (file name under onnx/, :class:`Report`, :class:`Comparison`) per model file;
    ``report`` and ``comparison`` are the published model's (the first); ``summary`` is
    quantize_report.json as the folder holds it.
    """

    _staged: StagedFolder

    def __init__(self, staged: StagedFolder, cleanup: list[PrivateFolder] = ()) -> None:
        super().__init__(staged, list(cleanup))
        self.variants = [(name, v.report, v.report.comparison) for name, v in staged.variants]
        _, self.report, self.comparison = self.variants[0]
        self.summary: dict = staged.report
        self.copied: list[str] = staged.copied
        #: Those of ``copied`` a symbolic link took from outside the source's folder (``allow_outside``).
        self.copied_outside: list[str] = staged.outside

    def _staged_for(self) -> Path | None:
        return self._staged.output

    def _commit(self, path, alongside=None) -> list[FileRecord]:
        if self._saved is not None:
            raise UsageError("the folder was saved already; copy it from there", self._staged_for())
        return self._staged.commit(path, alongside=alongside)

    def _json(self, files: list[FileRecord]) -> dict:
        return self.summary  # quantize_report.json (the folder holds it too)

    def __repr__(self) -> str:
        return f"<onnxsmith.QuantizedFolder {'; '.join(self.report.headline[:2])}>"


# ---------------------------------------------------------------------------------------------
# What a call runs the models on and judges them by


#: Made-up input sets a transform with static activation scales (int8's Convs) measures their ranges on: on the
#: corpus's CNNs, 16 photo crops left the largest activation of other pictures at most 1.3x the measured range
#: (p90 1.02-1.36x), 2 crops up to 2.6x.
RANGE_SAMPLES = 16


@dataclasses.dataclass(frozen=True)
class VerifySettings(InputOptions):
    """How a call runs a model and its variant and judges them: the keywords every verifying call takes.

    The input sets (settings/inputs.py, the declaration the commands' input flags come from): ``feeds``
    (see the module doc), else ``samples`` random sets from the model's input spec seeded from ``seed`` and
    sized by ``shape``; ``feeds``, ``shape`` and ``input_role`` widened here to what a call may pass besides
    the command line's strings. The gate's bounds (settings/gate.py): a call takes each as a keyword
    (``min_cosine``, ``rtol``, ``atol``, ``min_agreement``; None: from the number format the two differ in,
    docs/gate.md).
    """

    feeds: Feeds | None = opts.same_option(InputOptions, "feeds")
    shape: Shape | None = opts.same_option(InputOptions, "shape")
    input_role: str | Sequence[str] | None = opts.same_option(InputOptions, "input_role")
    gate: GateOptions = dataclasses.field(default_factory=GateOptions)

    def input_sets(self, model: ir.Model, ranges: dict[str, str] | None = None) -> list[dict[str, np.ndarray]]:
        """The input sets; ``ranges``: made-up images of these inputs in these value ranges instead."""
        return _input_sets(
            model,
            self.feeds,
            samples=self.samples,
            seed=self.seed,
            shape=self.shape,
            input_role=self.input_role,
            ranges=ranges,
        )

    def in_every_range(self, model: ir.Model) -> list[dict[str, np.ndarray]]:
        """The input sets, and as many again in each other value range as likely for an image input whose range
        is a guess between some (:func:`~onnxsmith.analysis.input_roles.ranges_alike`): static scales fit to all
        of them, and a gate passed on all of them, hold whichever one real pictures are in."""
        sets = self.input_sets(model)  # made first: sizing them measures the ranges
        alike = ranges_alike(model, parse_role_options(self.input_role)) if self.feeds is None else {}
        for k in range(1, max(map(len, alike.values()), default=1)):
            sets += self.input_sets(model, {name: ranges[min(k, len(ranges) - 1)] for name, ranges in alike.items()})
        return sets

    def inputs_taken_as(self, model: ir.Model) -> tuple[str, ...]:
        """What each input was taken to be, where onnxsmith makes the inputs or converts a folder of files."""
        given = parse_role_options(self.input_role)
        if self.feeds is None:
            return tuple(describe_inputs(model, given))
        if isinstance(self.feeds, (str, os.PathLike)):
            return describe_data(self.feeds, model, given)
        return ()


# ---------------------------------------------------------------------------------------------
# Calls


def fp16(model: ModelLike, *, samples: int = 4, **keywords) -> Variant:
    """fp16 weights and compute with fp32 islands where measured ranges overflow (``onnxsmith fp16``).

    Options: ``keep_io_types``, ``headroom``, ``rescale_residual``, ``residual_fp32``, ``small_fp32``
    (docs/fp16.md).
    """
    return transform(model, "fp16", samples=samples, **keywords)


def fuse(model: ModelLike, *, samples: int = 2, **keywords) -> Variant:
    """A transformer fused into onnxruntime's contrib ops (``onnxsmith fuse``).

    Options: ``precision`` ("fp32" or "fp16"), ``static_dims``, ``prune_rows`` (docs/fuse.md).
    """
    return transform(model, "fuse", samples=samples, **keywords)


def shrink(model: ModelLike, *, samples: int = 2, **keywords) -> Variant:
    """Smaller without changing what it computes (``onnxsmith shrink``).

    Options: ``max_fold_growth``, ``fold``, ``narrow_int64``, ``narrow_fp64``, ``dedup`` (docs/shrink.md).
    """
    return transform(model, "shrink", samples=samples, **keywords)


def int8(model: ModelLike, *, samples: int = 4, **keywords) -> Variant:
    """Linear layers int8 for onnxruntime on CPU where measured error allows (``onnxsmith int8``).

    Options: ``error_budget``, ``max_layer_error``, ``smooth_gain``, ``sensitivity``, ``two_pass_activations``,
    ``compensate_rounding``, ``convs``, ``speed`` (the variant timed against the source, the speed-up
    reported), ``keep_fast`` (int8 parts measured not to make it faster kept fp32), ``min_cosine`` (the gate: every output's cosine to the source's; docs/int8.md).
    """
    return transform(model, "int8", samples=samples, **keywords)


def transform(
    model: ModelLike,
    name: str,
    *,
    samples: int = 4,
    external_data: bool | None = None,
    out: str | os.PathLike | None = None,
    progress: Progress = _quiet,
    **keywords,
) -> Variant:
    """Apply the transform ``name`` to ``model`` and verify it like ``onnxsmith NAME`` does.

    ``keywords``: the transform's options and :class:`VerifySettings`' fields (``feeds``, ``seed``,
    ``shape``; ``min_cosine``/``rtol``/``atol``, the gate's bounds, default: from the number format
    the variant differs in, docs/gate.md; a transform with its own ``min_cosine`` option, int8,
    takes it as that option). ``external_data``: True forces a data file beside the .onnx, None
    decides by size. ``out``: where :meth:`Variant.save` writes by default; checked before any
    work, and the variant is staged beside it.
    """
    transform_cls = type(get_transform(name))
    on_engines = [f.name for f in dataclasses.fields(EngineOptions)] if transform_cls.on_engines else []
    where = opts.build(
        EngineOptions, {k: keywords.pop(k) for k in on_engines if k in keywords}, where=f"onnxsmith.{name}()"
    )
    verify, settings = _arguments(
        name, keywords, samples, _TRANSFORM_PARAMETERS + tuple(on_engines), transform_cls.Options
    )
    unseen = transform_cls.judged_on_unseen
    with (
        _prepared(model, verify, out=out, external_data=external_data, unseen=unseen) as (
            source,
            verification,
            staging,
        ),
        make_engine(where) as engine,
    ):
        verification = dataclasses.replace(verification, engine=engine)
        staged = make_variant(source, [(name, settings)], verification, staging, progress)
    return Variant(staged)


def extract(
    model: ModelLike,
    *,
    outputs: Sequence[str],
    inputs: Sequence[str] | None = None,
    samples: int = 2,
    external_data: bool | None = None,
    out: str | os.PathLike | None = None,
    progress: Progress = _quiet,
    **keywords,
) -> Piece:
    """The subgraph between the tensors ``inputs`` and ``outputs`` as a model of its own (``onnxsmith extract``).

    ``inputs`` None: the source's inputs that the outputs read. Verified on the source's own
    values of the cut tensors (``feeds`` are the source's inputs), by the gate's bounds
    (``min_cosine``/``rtol``/``atol``: default from the piece's number formats); ``keywords``:
    :class:`VerifySettings`' fields. ``external_data`` None: as the source keeps its weights.
    """
    if isinstance(outputs, str) or (inputs is not None and isinstance(inputs, str)):
        raise UsageError("extract(): inputs and outputs are lists of tensor names")
    verify, _ = _arguments("extract", keywords, samples, _EXTRACT_PARAMETERS)
    cut = (None if inputs is None else list(inputs), list(outputs))
    with _prepared(model, verify, out=out, external_data=external_data) as (source, verification, staging):
        staged = make_piece(source.path, *cut, verification, staging, progress)
    return Piece(staged)


def quantize(
    model: ModelLike,
    *,
    gate_samples: int = 4,
    gate_length: int = 32,
    seed: int = 0,
    out: str | os.PathLike | None = None,
    allow_outside: bool = False,
    progress: Progress = _quiet,
    **options,
) -> QuantizedFolder:
    """A language model with 4-bit (8-bit) weights in the folder layout transformers.js loads (``onnxsmith quantize``).

    ``model``: an optimum/transformers.js folder (``onnx/model.onnx`` beside config and tokenizer
    files, which are copied), an .onnx file, or a model in memory. Judged by the LM gate on
    ``gate_samples`` sequences of ``gate_length`` tokens sampled from the source. A config or tokenizer
    file that a symbolic link takes outside the folder is refused unless ``allow_outside`` (then
    ``copied_outside`` names it, as the report does). Options:
    ``scheme``, ``block_size``, ``symmetric``, ``format``, ``head``, ``last_token``, ``max_kl``,
    ``min_top1``, ... (docs/quantize.md).
    """
    settings = _options(QuantizeOptions, options, "quantize", _QUANTIZE_PARAMETERS)
    with _Source(model, out, folder_ok=True) as source:
        staged = stage_folder(
            source.path,
            settings,
            output=None if out is None else Path(out),
            gate_samples=gate_samples,
            gate_length=gate_length,
            seed=seed,
            source_name=source.name,
            origin=source.origin,
            allow_outside=allow_outside,
            progress=progress,
        )
    return QuantizedFolder(staged)


def compare(
    reference: ModelLike | Variant,
    candidate: ModelLike | Variant,
    *,
    samples: int = 1,
    fp16_mode: str = "auto",
    **keywords,
) -> Comparison:
    """Run both on the same inputs and judge every output with the gate every command uses (``onnxsmith compare``).

    ``keywords``: :class:`VerifySettings`' fields: the inputs (``feeds``, ``seed``, ``shape``) and the
    gate's bounds (``min_cosine``/``rtol``/``atol``, default: from the number format the two differ
    in, docs/gate.md); ``comparison.verdict()`` says why it failed, in one line.
    ``fp16_mode``: "auto" runs a model with fp16 tensors storage-faithfully (as a GPU holds
    them); "native" as onnxruntime's CPU provider runs it. ``comparison.passed`` is the verdict.
    """
    verify, _ = _arguments("compare", keywords, samples, _COMPARE_PARAMETERS)
    with _Source(reference) as ref, _Source(candidate) as cand:
        source = load_model(ref.path)
        input_sets = verify.input_sets(source)
        gate = verify.gate
        comparison = compare_models(
            ref.path,
            cand.path,
            input_sets,
            min_cosine=gate.min_cosine,
            rtol=gate.rtol,
            atol=gate.atol,
            min_agreement=gate.min_agreement,
            fp16_mode=fp16_mode,
        )
        layout = cache_layout(source)
        if comparison.passed and layout is not None and cache_layout(load_model(cand.path, checker=False)) == layout:
            # two cached decoders: judged by what they generate too, as every command judges a decoder's variant
            comparison.judgements.append(lm.generation_judgement(ref.path, cand.path, gate.min_generation))
    return dataclasses.replace(comparison, reference=ref.name, candidate=cand.name)


def build(
    recipe: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    bench: bool = True,
    force: bool = False,
    progress: Progress = _quiet,
    log: Progress = _quiet,
    **execution,
):
    """The release a recipe describes, built into ``out`` (``onnxsmith build``); returns a ``BuildResult``.

    ``out`` None: release/<the recipe's folder name>. A variant that fails its gates is not
    published (``result.failed`` says why); the others are. ``bench=False`` skips the timing.
    ``execution`` keywords (``engine``, ``address``, ``workers``, ``shard_size``, ``shard_dir``) replace the
    recipe's ``[execution]`` ones: where its validation's samples run.
    """
    from onnxsmith.release.build import build as build_release  # matplotlib & co: only when building
    from onnxsmith.release.build import default_out
    from onnxsmith.release.recipe import load_recipe

    loaded = load_recipe(recipe)
    if execution:  # the caller's word on where the validation runs, over the recipe's [execution]
        given = {**opts.to_json(loaded.execution), **execution}
        loaded = dataclasses.replace(loaded, execution=opts.build(ExecutionOptions, given, where="onnxsmith.build()"))
    target = Path(out) if out is not None else default_out(loaded.path)
    return build_release(loaded, target, progress=progress, log=log, bench=bench, force=force)


def build_all(
    recipes: Sequence[str | os.PathLike],
    out: str | os.PathLike | None = None,
    *,
    bench: bool = True,
    force: bool = False,
    progress: Progress = _quiet,
    **execution,
):
    """Several recipes built at once (``onnxsmith build A.toml B.toml``, or a folder of them): a job per
    (recipe, variant) and one per release on an execution engine (``engine="ray"``, ``address``, ``workers``:
    settings/execution.py; here by default); returns a ``BuiltRecipe`` per recipe, in order. ``out``: the folder the releases go in, each named as
    ``build`` names it (default: release/). Every recipe is checked before any is built."""
    from onnxsmith.release.many import build_many, plan_builds, recipes_in

    settings = opts.build(ExecutionOptions, execution, where="onnxsmith.build_all()")
    planned = plan_builds(recipes_in(list(recipes)), Path(out) if out is not None else None)
    with make_engine(settings) as engine:
        return build_many(planned, engine, bench=bench, force=force, progress=progress)


def check_outputs(
    outputs: Sequence[str | os.PathLike | None],
    *,
    sources: Sequence[str | os.PathLike] = (),
    model_folders: bool = False,
    run_only: bool = False,
) -> None:
    """Refuse, before any work, outputs that cannot be written or that a source reads (as every call does).

    ``sources``: model files, each loaded (a bad one is refused here); with ``model_folders``
    a source may also be a model folder, its onnx/model.onnx (as ``quantize`` takes). None in
    ``outputs``: not asked for. ``run_only``: the sources are only run (``eval-lm``), so one that
    onnx.checker refuses and onnxruntime opens is accepted (``runtime.runner.load_runnable``).
    """
    models = [source_model(Path(s))[0] if model_folders else s for s in sources]
    if run_only:
        protect = sorted({f for m in models for f in source_files(runner.load_runnable(m), m)})
    else:
        protect = files_read_by(*models) if models else []
    _check_outputs(outputs, protect=protect)


# ---------------------------------------------------------------------------------------------
# Looking at models: what they are, what they predict, how fast they run, how well they score


def inspect(model: ModelLike, *, top: int = 10) -> ModelSummary:
    """What a model is made of and what looks wrong with it (``onnxsmith inspect``).

    A :class:`~onnxsmith.analysis.summary.ModelSummary`: IR version, opsets, inputs and outputs,
    ops, parameters and bytes by dtype, the ``top`` largest tensors, warnings; ``to_json()``.
    """
    with _Source(model) as source:
        loaded = load_model(source.path)
        infer_types(loaded)  # shapes let the warnings size computed tensors
        return summarize(loaded, top=top, file_bytes=source.path.stat().st_size)


def validate(
    source: ModelLike,
    variant: ModelLike | Variant,
    *,
    task: str,
    gates: Mapping[str, float] | None = None,
    fp16_mode: str = "auto",
    progress: Progress = _quiet,
    **options,
) -> Validation:
    """``variant`` judged against ``source`` on a task's data (``onnxsmith validate``).

    ``task``: "faceage", "lm" or "generic"; its options as keywords (``data``,
    ``limit``, ...); ``gates``: bounds on its metrics (``{"max_abs_age_error": 0.1}``), replacing
    the task's defaults for those metrics. ``validation.passed`` is the verdict, ``failures()`` why.
    Where the samples run, as keywords too (settings/execution.py): ``engine="ray"`` (a Ray cluster started
    here) or ``address`` (the one there), ``workers``, ``shard_size``, ``shard_dir`` (kept shards: a rerun
    resumes); the numbers are the same anywhere.
    """
    task_obj = get_task(task)
    where = [f.name for f in dataclasses.fields(ExecutionOptions)]
    execution = opts.build(
        ExecutionOptions, {k: options.pop(k) for k in where if k in options}, where="onnxsmith.validate()"
    )
    settings = _options(task_obj.Options, options, "validate", _VALIDATE_PARAMETERS + tuple(where))
    bounds = check_gates(task_obj, dict(gates or {}))
    with _Source(source) as ref, _Source(variant) as cand, make_engine(execution) as engine:
        run = TaskRun(
            task_obj, settings, ref.path, fp16_mode=fp16_mode, progress=progress, execution=execution, engine=engine
        )
        validation = run.validate(cand.path, bounds, name=cand.name)
    return dataclasses.replace(validation, reference=ref.name)


def predict(
    model: ModelLike,
    image: str | os.PathLike,
    *,
    task: str = "faceage",
    box: tuple[float, float, float, float] | None = None,
    fp16_mode: str = "auto",
    **options,
) -> dict[str, Any]:
    """One prediction, for checking by hand (``onnxsmith predict``): the task's answer for ``image``.

    ``box``: the face as (x, y, width, height) in pixels (None: the image is the crop). For
    faceage: ``{"age", "gender", "p", "run"}``; ``run`` says how the model was run.
    """
    task_obj = get_task(task)
    if not hasattr(task_obj, "predict_feeds"):
        raise UsageError(f"task '{task_obj.name}' cannot predict from an image")
    if box is not None and (len(box) != 4 or not box[2] > 0 or not box[3] > 0):  # nan is not > 0
        raise UsageError(f"box {box}: expected (x, y, width, height) with a positive width and height")
    if box is not None and box_problem(box):
        raise UsageError(f"box {box}: {box_problem(box)}")
    settings = _options(task_obj.Options, options, "predict", _PREDICT_PARAMETERS)
    with _Source(model) as source:
        feeds = task_obj.predict_feeds(load_model(source.path), image, box, settings)
        session, loaded, mode = prepare_session(source.path, fp16_mode)
        outputs = runner.run(session, adapt_feeds(feeds, loaded), label=source.path)
    return {**task_obj.decode(outputs, settings)[0], "run": mode}


def eval_lm(
    models: Sequence[str | os.PathLike],
    text: str | os.PathLike,
    *,
    tokenizer: str | os.PathLike | None = None,
    window: int = lm.DEFAULT_WINDOW,
    max_windows: int | None = None,
    threads: int | None = None,
    session_config: Mapping[str, str] | None = None,
    progress: Progress = _quiet,
) -> lm.TextScores:
    """Language models' loss, perplexity, KL and top-1 agreement on held-out text (``onnxsmith eval-lm``).

    The first model is the reference; the text (a UTF-8 file) is tokenized with ``tokenizer``
    (default: the first model's folder's tokenizer.json) into windows of ``window`` tokens.
    ``session_config``: onnxruntime session config entries every model gets.
    """
    if isinstance(models, (str, os.PathLike)):
        raise UsageError("eval_lm(): models is a list of .onnx files, the first the reference")
    return lm.score_text(
        list(models),
        text,
        tokenizer=tokenizer,
        window=window,
        max_windows=max_windows,
        threads=threads,
        session_config=dict(session_config or {}),
        progress=progress,
    )


def bench(
    models: Sequence[str | os.PathLike],
    *,
    batch: Sequence[int] = (1,),
    provider: str = "cpu",
    runs: int = 20,
    warmup: int = 3,
    threads: int | None = None,
    shape: Shape | None = None,
    session_config: Mapping[str, str] | None = None,
    progress: Progress = _quiet,
) -> BenchRun:
    """Latency per batch size, throughput, session load time and peak memory (``onnxsmith bench``).

    Each model runs in its own process. ``shape``: sizes of symbolic dims other than the batch.
    A model that cannot be benchmarked (or a batch size it cannot take) is in the result's
    ``failures`` (``shortfall()`` in one line); the others are measured.
    """
    if isinstance(models, (str, os.PathLike)):
        raise UsageError("bench(): models is a list of .onnx files")
    _shape(shape)  # checked here, given to each model's process as text
    given = {"batch": list(batch), "provider": provider, "runs": runs, "warmup": warmup, "threads": threads}
    options = opts.build(BenchOptions, {**given, "shape": _shape_items(shape)}, where="onnxsmith.bench()")
    settings = BenchSettings.of(options)
    files_read_by(*models)  # a file that is no model is refused before any work
    names = [Path(m).name for m in models]
    if len(set(names)) != len(names):  # two files of one name in different folders
        names = [str(m) for m in models]
    config = dict(session_config or {})
    return bench_models([(n, m, config) for n, m in zip(names, models)], settings, progress=progress)


def card(release: str | os.PathLike, *, recipe: str | os.PathLike | None = None) -> FileRecord:
    """Write a release's README.md again from its measurements.json (``onnxsmith card``).

    The files it pins are re-hashed first (a changed one is refused). ``recipe``: take the
    title, description, homepage and license from this (possibly edited) recipe's [card].
    """
    from onnxsmith.release.build import rewrite_card  # matplotlib & co: only when writing
    from onnxsmith.release.recipe import load_recipe

    fields = None
    if recipe is not None:
        loaded = load_recipe(recipe)
        fields = {
            "title": loaded.card.title or loaded.source.stem,
            "description": loaded.card.description,
            "homepage": loaded.card.homepage,
            "license": loaded.license_text(),
        }
    return rewrite_card(Path(release), fields)


# ---------------------------------------------------------------------------------------------
# Arguments

#: Each call's own keywords (shown beside the options when one is unknown).
_GATE_PARAMETERS = tuple(f.name for f in dataclasses.fields(GateOptions))
_VERIFY_PARAMETERS = (*(f.name for f in dataclasses.fields(VerifySettings) if f.name != "gate"), *_GATE_PARAMETERS)
_TRANSFORM_PARAMETERS = (*_VERIFY_PARAMETERS, "external_data", "out", "progress")
_EXTRACT_PARAMETERS = ("outputs", "inputs", *_TRANSFORM_PARAMETERS)
_COMPARE_PARAMETERS = (*_VERIFY_PARAMETERS, "fp16_mode")
_QUANTIZE_PARAMETERS = ("gate_samples", "gate_length", "seed", "out", "allow_outside", "progress")
_VALIDATE_PARAMETERS = ("task", "gates", "fp16_mode", "progress")
_PREDICT_PARAMETERS = ("task", "box", "fp16_mode")


def _options(options_cls, given: dict[str, Any], call: str, parameters: tuple[str, ...]):
    known = [f.name for f in dataclasses.fields(options_cls)] if options_cls is not None else []
    unknown = sorted(k for k in given if k.replace("-", "_") not in known)
    if unknown:
        options = f"options: {', '.join(known)}; " if known else ""
        raise UnknownKeyword(
            f"onnxsmith.{call}() got an unknown keyword '{unknown[0]}' ({options}parameters: {', '.join(parameters)})"
        )
    return opts.build(options_cls, given, where=f"onnxsmith.{call}()") if options_cls is not None else None


def _arguments(call: str, keywords: dict[str, Any], samples: int, parameters: tuple[str, ...], options_cls=None):
    """A verifying call's keywords split: its :class:`VerifySettings` and its transform's options
    (a name that is both, int8's ``min_cosine``, is the transform's option: it hands it the gate)."""
    own = {f.name for f in dataclasses.fields(options_cls)} if options_cls is not None else set()
    verify = {k: v for k, v in keywords.items() if k in _VERIFY_PARAMETERS and k.replace("-", "_") not in own}
    options = {k: v for k, v in keywords.items() if k not in verify}
    bounds = {k: verify.pop(k) for k in _GATE_PARAMETERS if k in verify}
    where = f"onnxsmith.{call}()"
    gate = opts.build(GateOptions, bounds, where=where)  # a bound out of range: one line
    settings = opts.build(VerifySettings, {"samples": samples, **verify, "gate": gate}, where=where)  # samples=0 too
    return settings, _options(options_cls, options, call, parameters)


@contextlib.contextmanager
def _prepared(
    model: ModelLike,
    verify: VerifySettings,
    *,
    out: str | os.PathLike | None,
    external_data: bool | None,
    unseen: bool = False,
) -> Iterator[tuple[Source, Verification, Staging]]:
    """The source read once (a model in memory written to a file first), ``out`` checked before any work, and
    what the variant is made from: the input sets to calibrate and verify on and the gate's bounds; where it
    is staged and what the provenance says of the source."""
    with _Source(model, out) as source:
        read = Source.read(source.path)  # once: the input sets read it, the first make transforms it
        loaded = read.loaded
        if out is not None:
            _check_outputs([out], protect=read.files)
        made_up = verify.feeds is None
        given = parse_role_options(verify.input_role)
        gate_feeds = range_feeds = None
        if made_up and unseen:
            # Static scales from made-up inputs: their ranges from more of them (the first sets are the calibration's),
            # and what calibrated the variant does not judge it: the seeds after all of those do.
            calibrated = max(verify.samples, RANGE_SAMPLES)
            range_feeds = dataclasses.replace(verify, samples=calibrated).in_every_range(loaded)
            gate_feeds = dataclasses.replace(verify, seed=verify.seed + calibrated).in_every_range(loaded)
        # int8's pictures cover each range an image input is as likely in: that guess no longer stops its Convs
        covered = ranges_alike(loaded, given) if made_up and unseen else {}
        verification = Verification(
            verify.in_every_range(loaded) if covered else verify.input_sets(loaded),
            gate_feeds,
            gate=verify.gate,
            real_inputs=not made_up,
            plausible_inputs=made_up and plausible(loaded, given),
            guessed_ranges=tuple(n for n in guessed_ranges(loaded, given) if n not in covered) if made_up else (),
            unlike_real=tuple(_unlike_real_line(r) for r in unlike_real(loaded, given)) if made_up else (),
            range_feeds=range_feeds,
            inputs=verify.inputs_taken_as(loaded) + tuple(_covered_line(n, r) for n, r in covered.items()),
        )
        del loaded
        output = None if out is None else Path(out)
        yield read, verification, Staging(output, external_data, source.name, source.origin)


def _unlike_real_line(role: InputRole) -> str:
    """An input whose made-up values are not real data's, for int8's words on what stays fp32 and how to help."""
    hint = f"; --input-role {role.name}=0..1 states its range, if it is that" if role.kind == CONDITION else ""
    return f"'{role.name}' ({role.taken_as()}{hint})"


def _covered_line(name: str, ranges: tuple[str, ...]) -> str:
    return (
        f"'{name}': its value range is a guess between {' and '.join(ranges)}, as likely: calibrated and verified "
        "on as many pictures in each"
    )


def _input_sets(
    model: ir.Model,
    feeds: Feeds | None,
    *,
    samples: int,
    seed: int,
    shape: Shape | None,
    input_role: str | Sequence[str] | None = None,
    ranges: dict[str, str] | None = None,
) -> list[dict[str, np.ndarray]]:
    """The input sets a call calibrates and verifies on (see the module doc); ``ranges``: made-up images of these
    inputs in these value ranges instead."""
    given = parse_role_options(input_role)
    for name, value_range in (ranges or {}).items():
        given.setdefault(name, {})["value_range"] = value_range
    if feeds is not None:
        if isinstance(feeds, (str, os.PathLike)):
            shapes, dims = _shape(shape)
            return load_data(feeds, model, shapes=shapes, dims=dims, seed=seed, given=given)
        sets = [feeds] if isinstance(feeds, Mapping) else list(feeds)
        if not sets or not all(isinstance(s, Mapping) for s in sets):
            raise UsageError("feeds: expected {input name: array}, a list of them, or an .npz path")
        matched = [_matched(model, s) for s in sets]
        unlike = unlike_first(matched)
        if unlike is not None:
            raise UsageError(f"feeds: input set {unlike[0]}: {unlike[1]}")
        return matched
    if samples < 1:
        raise UsageError(f"samples must be at least 1, not {samples}")
    shapes, dims = _shape(shape)
    return inputs_that_run(model, shapes=shapes, dims=dims, samples=samples, seed=seed, given=given)  # sizes that run


def _matched(model: ir.Model, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An input set checked against the model's inputs (names, kinds), in the model's dtypes."""
    matched = {}
    for spec in input_specs(model):
        if spec.name not in arrays:
            raise UsageError(f"feeds: no array for input '{spec.name}' (given: {', '.join(sorted(arrays)) or 'none'})")
        array = np.asarray(arrays[spec.name])
        if array.dtype != spec.dtype:
            if array.dtype.kind != spec.dtype.kind:
                raise UsageError(f"feeds: input '{spec.name}' is {array.dtype}, the model wants {spec.dtype}")
            array = array.astype(spec.dtype)
        matched[spec.name] = array
    return matched


def _shape(shape: Shape | None) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    if shape is None:
        return {}, {}
    if not isinstance(shape, Mapping):
        return parse_shape_options(list(shape))
    shapes, dims = {}, {}
    for name, value in shape.items():
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            dims[name] = int(value)
        elif isinstance(value, Sequence) and all(isinstance(d, (int, np.integer)) for d in value):
            shapes[name] = tuple(int(d) for d in value)
        else:
            raise UsageError(
                f"shape: '{name}' must be a size (a named dim) or a tuple of sizes (an input), not {value!r}"
            )
    return shapes, dims


def _shape_items(shape: Shape | None) -> list[str]:
    """A shape as the CLI's strings (``x:1,3,224,224``, ``batch=2``): what a benchmark process reads."""
    if shape is None:
        return []
    if not isinstance(shape, Mapping):
        return list(shape)
    return [
        f"{name}={value}" if isinstance(value, (int, np.integer)) else f"{name}:{','.join(str(d) for d in value)}"
        for name, value in shape.items()
    ]


class _Source:
    """A model argument as a file: a path as it is; a model in memory written to a private file.

    The private copy lives for the ``with`` block (the variant is judged by then); ``name``
    and ``origin`` are what the provenance says of it.
    """

    def __init__(self, model, out: str | os.PathLike | None = None, *, folder_ok: bool = False) -> None:
        self._model = model
        self._out = out
        self._folder: PrivateFolder | None = None
        self.origin: str | None = None
        if isinstance(model, Variant):
            self.path = model.path
        elif isinstance(model, (str, os.PathLike)):
            self.path = Path(model)
        elif isinstance(model, (ir.Model, onnx.ModelProto)):
            self.path = None
        else:
            kinds = "a path, an onnx_ir.Model or an onnx.ModelProto" + (" (or a model folder)" if folder_ok else "")
            raise UsageError(f"expected {kinds} where a model is meant, got {type(model).__name__}")
        self.name = self.path.name if self.path is not None else None

    def __enter__(self) -> _Source:
        if self.path is not None:
            return self
        model = self._model
        kind = "onnx_ir.Model" if isinstance(model, ir.Model) else "onnx.ModelProto"
        if isinstance(model, onnx.ModelProto):
            model = ir.serde.deserialize_model(model)
        self.name = f"{_file_name(model.graph.name)}.onnx"
        self.origin = (
            f"an {kind} in memory (graph '{model.graph.name}')" if model.graph.name else f"an {kind} in memory"
        )
        where = Path(self._out).parent if self._out is not None else tempfile.gettempdir()
        self._folder = PrivateFolder(where)
        try:
            self.path = self._folder.path / self.name
            save_model(model, self.path)
        except BaseException:
            self._folder.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._folder is not None:
            self._folder.close()


def _file_name(text: str) -> str:
    """A graph's name as a file name (letters, digits, ._-), "model" when there is none."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "model"
