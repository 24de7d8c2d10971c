"""A language model's folder quantized into the layout transformers.js loads (``onnxsmith quantize``).

SRC is an optimum/transformers.js model folder (``onnx/model.onnx`` beside config and
tokenizer files) or an .onnx file. OUT becomes such a folder::

    OUT/onnx/model_q4.onnx        the published model (last-position logits; q8: model_quantized.onnx)
    OUT/onnx/model_q4_full.onnx   the same weights with every position's logits, for evaluation
    OUT/config.json, tokenizer.json, ...   copied from the source folder
    OUT/quantize_report.json      what was done, the gates, the session options each runtime needs

Each .onnx is made by ``make_variant`` and judged by the LM gate (tasks/lm/gate.py) on
sequences sampled from the source. Everything is staged in a private folder (beside OUT
when it is known) and moved into place only when asked (:meth:`StagedFolder.commit`):
a failure leaves OUT as it was.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from onnxsmith.core import options as opts
from onnxsmith.core.errors import GateFailed, InputError, OutputError, UsageError
from onnxsmith.core.transform import Progress
from onnxsmith.io.files import (
    FileRecord,
    PrivateFolder,
    commit_files,
    copy_file,
    describe_os_error,
    display,
    made_dirs,
    same_file,
    same_file_system,
    stage_text,
    stage_texts,
    staging_dir,
)
from onnxsmith.io.load import load_model, source_files
from onnxsmith.io.paths import check_output, resolves_outside
from onnxsmith.quantize_engine.engine import prepare
from onnxsmith.release.variant import StagedVariant, Staging, VariantResult, Verification, make_variant
from onnxsmith.tasks import lm
from onnxsmith.tasks.lm import FOLDER_FILES
from onnxsmith.transforms.quantize import Quantize, QuantizeOptions

REPORT_FILE = "quantize_report.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
#: transformers.js's file suffix per dtype (model{suffix}.onnx).
SUFFIX = {"q4": "_q4", "q8": "_quantized"}


def _quiet(_: str) -> None:
    pass


def source_model(source: Path) -> tuple[Path, Path | None]:
    """(the .onnx to quantize, the model folder whose files are copied, if it is one)."""
    if source.is_dir():
        model = source / "onnx" / "model.onnx"
        if not model.is_file():
            found = sorted(p.name for p in (source / "onnx").glob("*.onnx")) if (source / "onnx").is_dir() else []
            raise InputError(
                f"no onnx/model.onnx in the folder (found: {', '.join(found) or 'no .onnx files'})", source
            )
        return model, source
    if not source.exists():
        raise InputError("no such file or folder", source)
    return source, (source.parent.parent if source.parent.name == "onnx" else None)


@dataclass(frozen=True)
class StagedFolder:
    """A quantized model folder, made and judged; its files wait in a private folder.

    ``variants``: (file name under onnx/, the staged variant) in the order they were made;
    when one fails its gate the ones after it are not made. :meth:`commit` moves every
    file into OUT at once; :meth:`discard` removes what was not committed.
    """

    source: Path
    variants: list[tuple[str, StagedVariant]]
    #: quantize_report.json, as written.
    report: dict
    #: The files copied from the source folder (config, tokenizer).
    copied: list[str]
    #: Those of them that a symbolic link took from outside the folder (``allow_outside``).
    outside: list[str]
    folder: PrivateFolder
    #: The output folder it was staged for, if known.
    output: Path | None
    protect: list[Path]

    @property
    def failure(self) -> str | None:
        return next((v.failure for _, v in self.variants if not v.passed), None)

    @property
    def passed(self) -> bool:
        return self.failure is None

    def commit(self, output: str | os.PathLike | None = None, *, alongside=None) -> list[FileRecord]:
        """Move the folder's files into ``output`` (default: where it was staged for); return the models'.

        ``alongside``: (path, render) of a text file committed with them (a ``--report``), written
        before anything moves (see ``StagedModel.commit``).

        Staged on another file system, the files are first copied beside ``output``; all are
        then renamed into place, the models' data files before the models, the report last.
        """
        output = Path(output) if output is not None else self.output
        if output is None:
            raise UsageError("no output folder given; say where to save the quantized model")
        check_output(output, protect=self.protect, folder=True)
        if alongside is not None:
            check_output(alongside[0], protect=self.protect)
        tmp = self.folder.path
        models = [record for _, variant in self.variants for record in reversed(variant.staged.committed)]
        names = [f"onnx/{record.path.name}" for record in models] + self.copied + [REPORT_FILE]
        records = [FileRecord(output / "onnx" / r.path.name, r.bytes, r.sha256) for r in reversed(models)]
        with made_dirs(output / "onnx"), contextlib.ExitStack() as stack:
            copies = stack.enter_context(staging_dir(output))
            pairs = []
            for name in names:
                staged = tmp / name
                if not same_file_system(tmp, output):
                    staged = copies / name
                    staged.parent.mkdir(exist_ok=True)
                    _copy(tmp / name, staged, output / name)
                pairs.append((staged, output / name))
            if alongside is not None:
                pairs += stage_texts(stack, [(Path(alongside[0]), alongside[1](records))])
            commit_files(pairs, protect=self.protect)
        return records

    def results(self, files: list[FileRecord]) -> list[tuple[str, VariantResult]]:
        """(file name, what was measured) per variant, with its files as committed (``files``)."""
        return [
            (name, variant.result([f for f in files if f.path.name in (name, name + ".data")]))
            for name, variant in self.variants
        ]

    def discard(self) -> None:
        self.folder.close()


def quantize_folder(
    source: Path,
    output: Path,
    options: QuantizeOptions,
    *,
    gate_samples: int = 4,
    gate_length: int = 32,
    seed: int = 0,
    allow_outside: bool = False,
    progress: Progress = _quiet,
) -> tuple[Path, list[tuple[str, VariantResult]], dict]:
    """Write OUT (see the module doc); return (the source .onnx, the variants, the report).

    Raises :class:`GateFailed` (OUT left as it was) when a variant fails the LM gate.
    """
    staged = stage_folder(
        source,
        options,
        output=output,
        gate_samples=gate_samples,
        gate_length=gate_length,
        seed=seed,
        allow_outside=allow_outside,
        progress=progress,
    )
    try:
        if not staged.passed:
            raise GateFailed(staged.failure, output)
        files = staged.commit()
        return staged.source, staged.results(files), staged.report
    finally:
        staged.discard()


def stage_folder(
    source: Path,
    options: QuantizeOptions,
    *,
    output: Path | None = None,
    stage_in: str | os.PathLike | None = None,
    gate_samples: int = 4,
    gate_length: int = 32,
    seed: int = 0,
    source_name: str | None = None,
    origin: str | None = None,
    allow_outside: bool = False,
    progress: Progress = _quiet,
) -> StagedFolder:
    """Make and judge the quantized folder of ``source``; commit nothing (see :class:`StagedFolder`).

    ``allow_outside``: copy a file of the folder that a symbolic link takes outside it (a Hugging Face
    cache links every file to its blobs); without it such a file is refused before any work.
    """
    if gate_samples < 1 or gate_length < 2:
        raise UsageError("--gate-samples must be >= 1 and --gate-length >= 2")
    source, folder = source_model(Path(source))
    to_copy = _folder_files(folder, allow_outside=allow_outside)
    model = load_model(source)
    protect = source_files(model, source)
    if output is not None:
        check_output(output, protect=protect, folder=True)
    signature = lm.lm_signature(model, source)
    prepare(model, options, source)  # fail on a model without a head or weights before any work
    del model
    name = f"model{SUFFIX[options.scheme]}"
    plan = [(f"{name}.onnx", options)]
    if options.last_token:
        plan.append((f"{name}_full.onnx", opts.build(QuantizeOptions, {**opts.to_json(options), "last_token": False})))
    logging.getLogger("onnxscript").setLevel(logging.ERROR)  # the version converter's fallback notice

    private = PrivateFolder(output.resolve().parent if output is not None else stage_in or tempfile.gettempdir())
    try:
        tmp = private.path
        progress(f"sampling {gate_samples} sequences of {gate_length} tokens from the source")
        ids = lm.sample_sequences(source, count=gate_samples, length=gate_length, seed=seed)
        feeds = [lm.lm_feeds(signature, ids)]
        variants: list[tuple[str, StagedVariant]] = []
        for file_name, variant_options in plan:
            variant = make_variant(
                source,
                [(Quantize.name, variant_options)],
                Verification(feeds),
                Staging(tmp / "onnx" / file_name, source_name=source_name, origin=origin),
                progress=lambda message, f=file_name: progress(f"{f}: {message}"),
            )
            try:
                variant.commit()  # into the private folder's onnx/
            finally:
                variant.discard()
            variants.append((file_name, variant))
            if not variant.passed:
                break  # the folder is refused: the next variant would be judged for nothing
        copied, changed = _copy_folder_files(to_copy, tmp, output)
        outside = [name for name, _, real in to_copy if real is not None and name in copied]
        report = _report(source, folder, options, variants, copied, outside)
        if changed is not None:
            report["changed_on_copy"] = changed
        stage_text(tmp, (output or tmp) / REPORT_FILE, json.dumps(report, indent=2, default=str) + "\n")
    except BaseException:
        private.close()
        raise
    return StagedFolder(source, variants, report, copied, outside, private, output, protect)


def _folder_files(folder: Path | None, *, allow_outside: bool) -> list[tuple[str, Path, Path | None]]:
    """(name, path, where it really is when a link takes it outside the folder) per file to copy.

    What the output publishes comes from inside the model's folder, as ``build`` treats ``include``
    (io/paths.py's one test): a ``special_tokens_map.json -> ~/secret`` is refused, naming both, unless
    ``allow_outside``; then the report names it.
    """
    if folder is None:
        return []
    found = []
    for name in FOLDER_FILES:
        src = folder / name
        if not src.is_file():
            continue
        real = resolves_outside(src, folder)
        if real is not None and not allow_outside:
            raise InputError(
                f"is a symbolic link out of the model folder, to {display(real)} (in {display(real.parent)}); "
                "only files inside the folder are copied into the output, unless --allow-outside",
                src,
            )
        found.append((name, src, real))
    return found


def _copy_folder_files(
    files: list[tuple[str, Path, Path | None]], tmp: Path, output: Path | None
) -> tuple[list[str], str | None]:
    """Copy ``files`` into ``tmp``: the names copied, and what was changed on the way (None: nothing)."""
    copied, changed = [], None
    sources = {name: src for name, src, _ in files}
    for name, src in sources.items():
        if output is not None and (output / name).exists() and same_file(src, output / name):
            continue  # OUT is the source folder: the file is already there (and never changed)
        config = _config_with_template(src, sources.get("chat_template.jinja")) if name == TOKENIZER_CONFIG else None
        if config is None:
            _copy(src, tmp / name, (output or tmp) / name)
        else:
            stage_text(tmp, (output or tmp) / name, config)
            changed = (
                f"{name}: chat_template added from chat_template.jinja (transformers.js reads a template only there)"
            )
        copied.append(name)
    return copied, changed


def _config_with_template(config_path: Path, template_path: Path | None) -> str | None:
    """``tokenizer_config.json`` with the chat template of ``chat_template.jinja`` when it has none: transformers
    saves the template to the .jinja file, and transformers.js's tokenizers read it only from the config (4.x:
    only processors read the file), so a chat model published without it there has no template in a web page.
    None: nothing to add (no template file, one already there, or a config that is not a JSON object)."""
    if template_path is None:
        return None
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        template = template_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # copied as it is: a file onnxsmith cannot read is the user's to fix
    if not isinstance(config, dict) or config.get("chat_template"):
        return None
    return json.dumps({**config, "chat_template": template}, indent=2, ensure_ascii=False) + "\n"


def _copy(source: Path, staged: Path, final: Path) -> None:
    try:
        copy_file(source, staged)
    except OSError as err:  # a full disk: one line naming the output, never a traceback
        raise OutputError(f"cannot write: {describe_os_error(err)}", final) from None


def _report(source: Path, folder: Path | None, options: QuantizeOptions, variants, copied, outside) -> dict:
    first = variants[0][1].report
    step = first.steps[0]
    return {
        "source": first.source.to_json(),
        "options": opts.to_json(options),
        "headline": first.headline,
        "variants": [
            {
                "file": f"onnx/{file_name}",
                "bytes": variant.report.bytes,
                "sha256": variant.staged.committed[0].sha256,  # the .onnx (its data file, if any, is listed in OUT)
                "size_vs_source": variant.report.size_ratio,
                "logits": "last position" if variant.report.steps[0].options["last_token"] else "every position",
                "gate": variant.report.comparison.to_json(),
            }
            for file_name, variant in variants
        ],
        "notes": step.notes,
        "weights": step.tables.get("weights", []),
        "weight_bytes": step.stats.get("weight_bytes"),
        "nodes": step.stats.get("nodes"),
        "session_options": step.runtime,
        "targets": step.stats.get("targets", {}),
        "copied": copied if folder is not None else "nothing: the source is not in a model folder",
        # taken through a symbolic link from outside the model folder (allow_outside): the report says so
        "copied_from_outside": outside,
    }
