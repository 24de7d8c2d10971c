"""The inputs a model is verified on: from its input spec (random, seeded) or from an .npz."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.input_roles import index_bound, input_roles, with_given
from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.io.files import human_bytes
from onnxsmith.io.load import SOURCE_PATH
from onnxsmith.io.paths import open_readable
from onnxsmith.runtime.plausible import noised_latents, past_length, role_value
from onnxsmith.settings.run import DEFAULT_SEED

#: The most bytes onnxsmith makes for one input it invents (4 GiB, or a quarter of the machine's memory where
#: that is less): an input declared [2**31, 4] (32 GiB) or sized 2**62 is refused in one line naming it and its
#: shape, before numpy allocates anything (it would die of memory, or raise "array is too big").
MAX_FEED_BYTES = 4 * 2**30


def feed_byte_limit() -> int:
    """:data:`MAX_FEED_BYTES`, or a quarter of the physical memory where that is less."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: the fixed cap alone
        return MAX_FEED_BYTES
    return min(MAX_FEED_BYTES, physical // 4) if physical > 0 else MAX_FEED_BYTES


def check_feed_size(spec: InputSpec, shape: tuple[int, ...], path: str | os.PathLike | None = None) -> None:
    """Refuse an input of ``shape`` whose array would exceed :func:`feed_byte_limit` (computed in Python
    integers: numpy's own product of 2**62-sized dims overflows)."""
    size = math.prod(shape) * spec.dtype.itemsize
    limit = feed_byte_limit()
    if size > limit:
        raise InputError(
            f"input '{spec.name}' of shape [{', '.join(map(str, shape))}] ({spec.dtype.name}) would take "
            f"{human_bytes(size)}, more than the {human_bytes(limit)} onnxsmith makes for one input; "
            "give it smaller sizes with --shape",
            path,
        )


@dataclass(frozen=True)
class InputSpec:
    """One graph input: its name, element type and dims (ints or symbolic names, None unknown).

    A negative fixed size (``dim_value: -1``, as PaddlePaddle's exporter writes a free batch)
    is no size: it is unknown (None), like an unnamed symbolic dim; onnxruntime treats it so.
    """

    name: str
    dtype: np.dtype
    dims: tuple[int | str | None, ...]

    def describe(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.name}: {self.dtype.name}[{dims}]"


def input_specs(model: ir.Model) -> list[InputSpec]:
    """The inputs a caller must feed (initializers listed as inputs are not among them)."""
    specs = []
    for value in model.graph.inputs:
        if value.name in model.graph.initializers:
            continue
        if value.dtype is None or not isinstance(value.type, ir.TensorType):
            kind = "has no element type" if value.dtype is None else f"is a {value.type}, not a tensor"
            raise InputError(
                f"graph input '{value.name}' {kind}; onnxsmith makes inputs for tensors only",
                model.meta.get(SOURCE_PATH),
            )
        dims: tuple[int | str | None, ...] = ()
        if value.shape is not None:
            dims = tuple(_spec_dim(d) for d in value.shape)
        specs.append(InputSpec(value.name, np.dtype(value.dtype.numpy()), dims))
    return specs


def _spec_dim(dim: int | ir.SymbolicDim) -> int | str | None:
    if isinstance(dim, int):
        return dim if dim >= 0 else None
    return dim.value or None


def parse_shape_options(
    items: str | list[str] | None, *, option: str = "--shape"
) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """``NAME:d0,d1`` (a whole input) and ``DIM=N`` (a symbolic dim everywhere): the one parser of every
    command's ``--shape`` and a recipe's ``shape`` list.

    The items may come whole (``["x:1,3,224,224", "batch=2"]``) or cut at every comma by a
    comma-separated list option (``["x:1", "3", "224", "224"]``): a piece without ':' or '=' continues
    the dims before it. ``option`` is how errors name the option.
    """
    pieces = [p.strip() for item in ([items] if isinstance(items, str) else items or []) for p in item.split(",")]
    whole: list[str] = []
    for piece in pieces:
        if whole and ":" in whole[-1] and ":" not in piece and "=" not in piece:
            whole[-1] += "," + piece
        elif piece:
            whole.append(piece)
    shapes: dict[str, tuple[int, ...]] = {}
    dims: dict[str, int] = {}
    for item in whole:
        if "=" in item and ":" not in item:
            name, _, size = item.partition("=")
            if not name.strip() or not size.strip().isdigit():
                raise UsageError(f"{option} {item}: expected DIM=N with a non-negative integer N")
            dims[name.strip()] = int(size)
            continue
        name, sep, rest = item.rpartition(":")  # an input's name may hold ':' (TensorFlow's "x:0")
        if not sep or not name:
            raise UsageError(f"{option} {item}: expected NAME:d0,d1,... or DIM=N")
        try:
            shapes[name] = tuple(int(d) for d in rest.split(",") if d.strip() != "")
            if any(d < 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise UsageError(f"{option} {item}: dims must be integers >= 0") from None
    return shapes, dims


def resolve_shape(spec: InputSpec, shapes: dict[str, tuple[int, ...]], dims: dict[str, int]) -> tuple[int, ...]:
    if spec.name in shapes:
        shape = shapes[spec.name]
        if spec.dims and len(shape) != len(spec.dims):
            raise UsageError(f"--shape {spec.name}: {len(shape)} dims given, the input has {len(spec.dims)}")
        for given, declared in zip(shape, spec.dims):
            if isinstance(declared, int) and declared != given:
                raise UsageError(f"--shape {spec.name}: dim {given} conflicts with the model's fixed {declared}")
        return shape
    resolved = []
    for d in spec.dims:
        if isinstance(d, int):
            resolved.append(d)
        else:
            resolved.append(symbolic_dim_size(d, dims))
    return tuple(resolved)


def symbolic_dim_size(name: str | None, dims: dict[str, int]) -> int:
    """A symbolic dim's size: given by the user, a sum of sized terms (optimum writes
    ``past_sequence_length + sequence_length``), or :func:`default_dim`."""
    if name is not None and name in dims:
        return dims[name]
    if name is not None and "+" in name:
        return sum(int(t) if t.isdigit() else symbolic_dim_size(t, dims) for t in sum_terms(name))
    return default_dim(name)


def sum_terms(name: str) -> list[str]:
    """The terms of a dim named as a sum (optimum's ``past_sequence_length + sequence_length``); else the name."""
    return [t.strip() for t in name.split("+")]


def default_dim(name: str | None) -> int:
    """A symbolic dim nobody sized: 0 for a past length (an empty cache), 8 for a sequence, else 1."""
    lowered = (name or "").lower()
    if "past" in lowered:
        return 0
    if re.search(r"seq|len|time|token", lowered):
        return 8
    return 1


def random_inputs(
    model: ir.Model,
    *,
    shapes: dict[str, tuple[int, ...]] | None = None,
    dims: dict[str, int] | None = None,
    seed: int = DEFAULT_SEED,
    given: dict[str, dict[str, str]] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded plausible values for what each input is (:func:`~onnxsmith.analysis.input_roles.input_roles`;
    :mod:`onnxsmith.runtime.plausible`): images in their range, speech-like waveforms, lengths as long as what
    they measure, valid token ids, all-ones masks, a sample rate of 16 kHz, zero states; normal floats and
    small integers for inputs nothing identifies.

    Sizes: ``shapes`` and ``dims`` where given, else :func:`default_dim` (see
    :func:`onnxsmith.runtime.sizing.inputs_that_run` for sizes checked to run). ``given``: the user's
    corrections of what the inputs are (:func:`~onnxsmith.analysis.input_roles.parse_role_options`)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:  # numpy raises, deep down
        raise UsageError(f"the seed must be a non-negative integer, not {seed!r}")
    rng = np.random.default_rng(seed)
    specs = input_specs(model)
    sized = {spec.name: resolve_shape(spec, shapes or {}, dims or {}) for spec in specs}
    for spec in specs:  # before anything is allocated
        check_feed_size(spec, sized[spec.name], model.meta.get(SOURCE_PATH))
    roles = with_given(input_roles(model), given)
    past = past_length(roles, sized)
    feeds = {}
    for spec in specs:
        shape = sized[spec.name]
        made = role_value(roles[spec.name], spec.dtype, shape, sized, rng, past=past)
        feeds[spec.name] = made if made is not None else _random_value(model, spec, shape, rng)
    return noised_latents(roles, feeds, rng)


def _random_value(model: ir.Model, spec: InputSpec, shape: tuple[int, ...], rng) -> np.ndarray:
    name = spec.name.lower()
    kind = spec.dtype.kind
    if kind == "f" or spec.dtype.name in ("bfloat16",):
        return rng.standard_normal(shape).astype(spec.dtype)
    if kind == "b":
        return np.ones(shape, dtype=bool) if "mask" in name else rng.random(shape) < 0.5
    if kind in "iu":
        high = index_bound(model, spec.name) or 10
        return rng.integers(0, high, size=shape).astype(spec.dtype)
    raise InputError(
        f"cannot make random values for input '{spec.name}' of type {_type_name(model, spec)}; "
        "give the inputs as arrays (--inputs NPZ)",
        model.meta.get(SOURCE_PATH),
    )


def _type_name(model: ir.Model, spec: InputSpec) -> str:
    """The input's ONNX element type (STRING), not numpy's name for how it holds it (object)."""
    value = next((v for v in model.graph.inputs if v.name == spec.name), None)
    return value.dtype.name if value is not None and value.dtype is not None else str(spec.dtype)


def unlike_first(
    sets: Sequence[Mapping[str, np.ndarray]], first: str = "the first input set"
) -> tuple[int, str] | None:
    """(the index of the first input set, the problem) where an input's shape differs from the first set's
    (``first`` names it): the outputs of every set are compared stacked."""
    for i, feeds in enumerate(sets[1:], 1):
        for name, array in feeds.items():
            shape = np.shape(sets[0].get(name))
            if np.shape(array) != shape:
                return i, (
                    f"'{name}' is {list(np.shape(array))}, {first}'s {list(shape)}: every input set must have the "
                    "same shapes"
                )
    return None


def load_npz(path: str | os.PathLike, model: ir.Model) -> dict[str, np.ndarray]:
    """Inputs from an .npz whose array names are the model's input names."""
    return read_npz(path, input_specs(model))


def read_npz(path: str | os.PathLike, specs: Sequence[InputSpec]) -> dict[str, np.ndarray]:
    """The inputs ``specs`` describe from an .npz naming its arrays as they do, each in its spec's dtype."""
    path = Path(path)
    try:
        with open_readable(path, ".npz") as f, np.load(f, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except InputError:
        raise
    except Exception as err:
        raise InputError(f"not a readable .npz ({err})", path) from None
    feeds = {}
    for spec in specs:
        if spec.name not in arrays:
            raise InputError(f"has no array named '{spec.name}' (it has: {', '.join(sorted(arrays)) or 'none'})", path)
        array = arrays[spec.name]
        if array.dtype != spec.dtype:
            if array.dtype.kind != spec.dtype.kind:
                raise InputError(f"array '{spec.name}' is {array.dtype}, the model wants {spec.dtype}", path)
            array = array.astype(spec.dtype)
        feeds[spec.name] = array
    return feeds


def adapt_feeds(feeds: dict[str, np.ndarray], model: ir.Model) -> dict[str, np.ndarray]:
    """The same values in the other model's input types (an fp16-io variant takes fp16)."""
    adapted = {}
    for spec in input_specs(model):
        if spec.name not in feeds:
            raise InputError(f"the other model has no input '{spec.name}'; inputs must match")
        array = feeds[spec.name]
        adapted[spec.name] = array if array.dtype == spec.dtype else array.astype(spec.dtype)
    return adapted
