"""Weight quantization: the numbers, and the nodes that give a quantized weight back.

Two layouts, both of a weight ``w`` of a MatMul ``x @ w`` (``w`` is [K, N]):

* **blocked** along K (the reduction axis): every ``block_size`` consecutive rows of a
  column share one scale (and one zero point): ``w ≈ (q - zero_point) * scale``.
  4 or 8 bits, asymmetric (unsigned ``q`` and a zero point per block) or symmetric
  (signed ``q``, no zero point). Stored behind one blocked ``DequantizeLinear``
  (opset 21) or packed for com.microsoft ``MatMulNBits``.
* **per channel int8**, symmetric: one scale per index along one axis — per token for an
  embedding table, per output column for a weight whose K does not split into blocks.

A weight that onnxruntime's integer kernels multiply by uint8 activations must not use all of int8:
on x86 CPUs without VNNI (AVX2; CI's runners are a mix) uint8 x int8 goes through vpmaddubsw, which
adds each pair of products along K (rows k and k + 1, k even: MLAS packs K in fours) into int16 with
saturation, and full-range weights overflow it (255 * 127 * 2; measured: a product 10 % off, where VNNI's
kernels are exact). So a Linear's int8 weight (MatMulIntegerToFloat) either keeps each such pair's
``|q_k| + |q_k+1| <= PAIR_LIMIT`` (:func:`quantize_linear_int8`; 255 * 128 = 32,640 fits), which costs
about half a bit of a column's range, or is stored uint8 with all 8 bits (:func:`as_uint8`: uint8 x uint8
widens to int16 first, exact), which runs onnxruntime's uint8 x uint8 GEMM, 1.5-2x slower in whole models.
A Conv's int8 weight (QLinearConv, whose symmetric kernels need int8) keeps |q| <= :data:`CONV_INT8_LIMIT`
(255 * 64 * 2 = 32,640 fits). docs/int8.md has the measurements.

The zero point is an integer, so the asymmetric range always includes 0 (as
onnxruntime's own quantizer does): a block of one sign still restores 0 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.types import set_dtype

#: The most a pair of a Linear's int8 weights along K may add up to (the module doc).
PAIR_LIMIT = 128
#: Blocked DequantizeLinear (its block_size attribute, the 4-bit types) is opset 21, which needs IR version 10.
BLOCKED_DQ_OPSET = 21
BLOCKED_DQ_IR_VERSION = 10
#: (bits, symmetric) -> numpy dtype of the stored integers.
_STORED = {
    (4, False): np.dtype(ml_dtypes.uint4),
    (4, True): np.dtype(ml_dtypes.int4),
    (8, False): np.dtype(np.uint8),
    (8, True): np.dtype(np.int8),
}


@dataclass(frozen=True)
class Blocked:
    """A [K, N] weight quantized in blocks of ``block_size`` rows per column."""

    q: np.ndarray  # [K, N], dtype per _STORED
    scale: np.ndarray  # [ceil(K / block_size), N], the weight's float dtype
    #: like scale; dtype of q, or the scale's for a weight already on a grid with float offsets
    #: (:func:`on_grid`: only MatMulNBits holds it); None when symmetric
    zero_point: np.ndarray | None
    bits: int
    block_size: int

    @property
    def symmetric(self) -> bool:
        return self.zero_point is None

    @property
    def float_zero_point(self) -> bool:
        return self.zero_point is not None and self.zero_point.dtype.kind == "f"


#: A value is on a block's grid when it is this close to ``low + k * step`` (in steps): the grids of
#: GGUF files are fp16 numbers multiplied out in fp32, ~1e-6 of a step; a weight not on one is ~0.25 off.
_GRID_TOLERANCE = 1e-3


def on_grid(w: np.ndarray, bits: int, block_size: int) -> Blocked | None:
    """``w`` [K, N] exactly as stored, when every block of ``block_size`` along K already holds at most
    2^bits evenly spaced values ``low + k * step`` (a model dequantized from a GGUF Q4_1 / Q8_1 file):
    scale = step, float zero point = -low / step. None when any block is off its grid. An integer zero point
    cannot hold ``-low / step`` (round-to-nearest then moves a whole block by up to half a step)."""
    k, n = w.shape
    if w.ndim != 2 or k % block_size or w.dtype.kind != "f":
        return None
    grouped = w.astype(np.float64).reshape(k // block_size, block_size, n)
    low, high = grouped.min(axis=1), grouped.max(axis=1)
    step = (high - low) / ((1 << bits) - 1)
    safe = np.where(step == 0, 1.0, step)
    levels = (grouped - low[:, None, :]) / safe[:, None, :]
    q = np.rint(levels)
    if float(np.abs(levels - q).max()) > _GRID_TOLERANCE:
        return None
    zero_point = (-low / safe).astype(w.dtype)  # a constant block: q 0, scale 1, its value the offset
    return Blocked(q.reshape(k, n).astype(_STORED[bits, False]), safe.astype(w.dtype), zero_point, bits, block_size)


def on_symmetric_grid(w: np.ndarray, bits: int, block_size: int) -> Blocked | None:
    """``w`` [K, N] exactly as stored, when every block of ``block_size`` along K is ``d * q`` with whole numbers
    ``|q| <= 2^(bits-1) - 1`` and ``d = absmax / (2^(bits-1) - 1)`` (a GGUF Q8_0 table, dequantized): its symmetric
    blocks (:func:`quantize_blocked`), which restore it exactly. None when any block is off such a grid (an
    asymmetric form then loses less)."""
    if w.ndim != 2 or w.shape[0] % block_size or w.dtype.kind != "f":
        return None
    k = w.shape[0]
    half = (1 << (bits - 1)) - 1
    for columns in _slabs(w.T):  # some columns at a time: a [576, 49152] table in float64 is 226 MB
        grouped = w[:, columns].astype(np.float64).reshape(k // block_size, block_size, -1)
        step = np.abs(grouped).max(axis=1, keepdims=True) / half
        levels = grouped / np.where(step == 0, 1.0, step)
        if float(np.abs(levels - np.rint(levels)).max()) > _GRID_TOLERANCE:
            return None
    return quantize_blocked(w, bits, block_size, symmetric=True)


def quantize_blocked(w: np.ndarray, bits: int, block_size: int, symmetric: bool) -> Blocked:
    """Quantize ``w`` [K, N] in blocks along K. K need not be a multiple of the block (the last is short)."""
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D weight, got shape {w.shape}")
    k, n = w.shape
    blocks = -(-k // block_size)
    padded = np.zeros((blocks * block_size, n), dtype=np.float64)
    padded[:k] = w
    grouped = padded.reshape(blocks, block_size, n)
    qmax = (1 << bits) - 1
    if symmetric:
        half = (1 << (bits - 1)) - 1  # 7 or 127: the range is symmetric, -8/-128 stays unused
        absmax = np.abs(grouped).max(axis=1)
        scale = (absmax / half).astype(w.dtype)
        safe = np.where(scale == 0, 1, scale).astype(np.float64)
        q = np.clip(np.rint(grouped / safe[:, None, :]), -half, half)
        zero_point = None
    else:
        low = np.minimum(grouped.min(axis=1), 0.0)
        high = np.maximum(grouped.max(axis=1), 0.0)
        scale = ((high - low) / qmax).astype(w.dtype)
        safe = np.where(scale == 0, 1, scale).astype(np.float64)
        zp = np.clip(np.rint(-low / safe), 0, qmax)
        q = np.clip(np.rint(grouped / safe[:, None, :]) + zp[:, None, :], 0, qmax)
        zero_point = zp.astype(_STORED[bits, False])
    dtype = _STORED[bits, symmetric]
    q = q.reshape(blocks * block_size, n)[:k].astype(dtype)
    return Blocked(q, scale, zero_point, bits, block_size)


def side_by_side(parts: list[Blocked]) -> Blocked:
    """Weights of the same K and blocking as one [K, N1 + N2 + ...] weight, their columns in order."""
    first = parts[0]
    zero_points = [b.zero_point for b in parts]
    return Blocked(
        np.concatenate([b.q for b in parts], axis=1),
        np.concatenate([b.scale for b in parts], axis=1),
        None if any(z is None for z in zero_points) else np.concatenate(zero_points, axis=1),  # type: ignore[arg-type]
        first.bits,
        first.block_size,
    )


def dequantize_blocked(b: Blocked) -> np.ndarray:
    """The weight ``b`` stands for, as DequantizeLinear computes it (in the scale's dtype)."""
    k = b.q.shape[0]
    scale = np.repeat(b.scale.astype(np.float64), b.block_size, axis=0)[:k]
    q = b.q.astype(np.float64)
    if b.zero_point is not None:
        q = q - np.repeat(b.zero_point.astype(np.float64), b.block_size, axis=0)[:k]
    return (q * scale).astype(b.scale.dtype)


@dataclass(frozen=True)
class PerChannel:
    """A weight quantized to int8 with one scale per index along ``axis``."""

    q: np.ndarray  # int8, the weight's shape
    scale: np.ndarray  # [shape[axis]], the weight's float dtype
    axis: int


#: The largest |q| of a Conv's int8 weight: 7 bits, which no CPU's uint8 x int8 kernel saturates (module doc).
CONV_INT8_LIMIT = 64


def quantize_per_channel_int8(w: np.ndarray, axis: int, limit: int = 127) -> PerChannel:
    """Symmetric int8, one scale per index along ``axis`` (max |w| of the slice maps to ``limit``).

    Computed in float64 a slab of rows at a time (:data:`_SLAB_ELEMENTS`), with the same numbers. Widening a
    2 GB embedding table whole held up to three float64 copies of it at once, about 12 GB.
    """
    axis = axis % w.ndim
    others = tuple(i for i in range(w.ndim) if i != axis)
    slabs = _slabs(w)
    parts = [np.abs(w[rows].astype(np.float64)).max(axis=others) for rows in slabs]
    # along axis 0 each slab holds its own channels; along another, every slab holds part of each channel
    absmax = np.concatenate(parts) if axis == 0 else np.maximum.reduce(parts)
    scale = (absmax / limit).astype(w.dtype)
    safe = np.where(scale == 0, 1, scale).astype(np.float64)
    shape = [1] * w.ndim
    shape[axis] = -1
    divisor = safe.reshape(shape)
    q = np.empty(w.shape, dtype=np.int8)
    for rows in slabs:
        q[rows] = np.clip(np.rint(w[rows] / (divisor[rows] if axis == 0 else divisor)), -limit, limit).astype(np.int8)
    return PerChannel(q, scale, axis)


#: Elements of a weight widened to float64 at a time (32 MB): bounds the memory of quantizing a big table.
_SLAB_ELEMENTS = 1 << 22


def _slabs(w: np.ndarray) -> list[slice]:
    """``w`` along its first axis in slices of about :data:`_SLAB_ELEMENTS` elements (one: all of a small ``w``)."""
    step = max(1, _SLAB_ELEMENTS // max(1, w.size // max(1, w.shape[0])))
    return [slice(start, start + step) for start in range(0, max(1, w.shape[0]), step)]


def compensation_factor(gram: np.ndarray, damping: float = 0.01) -> np.ndarray | None:
    """What error-compensated rounding (:func:`quantize_columns_compensated`) needs of ``gram`` = XᵀX [K, K]
    of the calibration inputs: the upper Cholesky factor U of its inverse (UᵀU = gram⁻¹), or None where it
    has none (then rounding is to nearest). Computed once per input: the Linears reading it share it.

    ``damping`` (a share of the mean diagonal, added to it) keeps the inverse finite where the calibration
    inputs do not span every direction. Input channels never seen (zero diagonal) are rounded as they are.
    """
    k = gram.shape[0]
    h = np.array(gram, dtype=np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    h[np.diag_indices(k)] += damping * float(np.mean(np.diag(h)))
    try:
        lower_inverse = np.linalg.inv(np.linalg.cholesky(h))
        return np.linalg.cholesky(lower_inverse.T @ lower_inverse).T
    except np.linalg.LinAlgError:
        return None


def quantize_linear_int8(w: np.ndarray, pairs: bool = True) -> PerChannel:
    """Symmetric int8 per output column of ``w`` [K, N]; with ``pairs``, one that no CPU's integer kernel
    saturates on (the module doc): each pair of rows (k, k + 1), k even, keeps ``|q_k| + |q_k+1| <= PAIR_LIMIT``,
    the scale mapping the column's largest pair sum to 127 so that rounding alone keeps the pairs within."""
    if not pairs:
        return quantize_per_channel_int8(w, axis=1)
    magnitudes = np.abs(w.astype(np.float64))
    even = w.shape[0] - w.shape[0] % 2
    widest = magnitudes.max(axis=0, initial=0.0)
    if even:
        widest = np.maximum(widest, (magnitudes[:even:2] + magnitudes[1:even:2]).max(axis=0))
    scale = (widest / 127).astype(w.dtype)
    safe = np.where(scale == 0, 1, scale).astype(np.float64)
    q = np.clip(np.rint(w / safe), -127, 127)
    room = PAIR_LIMIT - np.abs(q[:even:2])  # a rounding up on both sides of a pair may still reach 129
    q[1:even:2] = np.clip(q[1:even:2], -room, room)
    return PerChannel(q.astype(np.int8), scale, 1)


def quantize_columns_compensated(
    w: np.ndarray, factor: np.ndarray | None, block: int = 128, pairs: bool = True
) -> PerChannel:
    """Symmetric int8 per output column of ``w`` [K, N] (the scales, and with ``pairs`` the pairs, of
    :func:`quantize_linear_int8`), rounded with error compensation (GPTQ, Frantar et al. 2022): rows are rounded
    in order and each row's rounding error is spread over the rows not yet rounded, weighted by the calibration
    inputs' XᵀX (through ``factor``, :func:`compensation_factor`; None: to nearest), so that
    ``||X (w - w_int8)||`` rather than ``||w - w_int8||`` is small. A pair's second row is cut back to the pair's
    room before its own error is compensated.
    """
    k, n = w.shape
    plain = quantize_linear_int8(w, pairs)
    if factor is None:
        return plain
    scale = np.where(plain.scale == 0, 1, plain.scale).astype(np.float64)
    work = w.astype(np.float64)  # rounded rows are replaced by what is left to compensate
    q = np.zeros((k, n), dtype=np.float64)
    for start in range(0, k, block):  # ``block`` is even: a pair never straddles two blocks
        stop = min(start + block, k)
        rows, errors, u = work[start:stop].copy(), np.zeros((stop - start, n)), factor[start:stop, start:stop]
        for i in range(stop - start):
            row = q[start + i]  # a view
            row[:] = np.clip(np.rint(rows[i] / scale), -127, 127)
            if pairs and (start + i) % 2:
                room = PAIR_LIMIT - np.abs(q[start + i - 1])
                row[:] = np.clip(row, -room, room)
            errors[i] = (rows[i] - row * scale) / u[i, i]
            rows[i:] -= u[i, i:, None] * errors[i]
        work[stop:] -= factor[start:stop, stop:].T @ errors
    return PerChannel(q.astype(np.int8), plain.scale, 1)


def as_uint8(p: PerChannel) -> tuple[np.ndarray, np.ndarray]:
    """``p``'s weight as uint8 with zero point 128 per channel: the same values, multiplied exactly by every
    CPU's integer kernel (the module doc says why int8 is not)."""
    q = (p.q.astype(np.int16) + 128).astype(np.uint8)
    return q, np.full(p.q.shape[p.axis], 128, dtype=np.uint8)


def dequantize_per_channel(p: PerChannel) -> np.ndarray:
    shape = [1] * p.q.ndim
    shape[p.axis] = -1
    return (p.q.astype(np.float64) * p.scale.astype(np.float64).reshape(shape)).astype(p.scale.dtype)


def relative_error(w: np.ndarray, restored: np.ndarray) -> float:
    """||w - restored|| / ||w||: how much of the weight the quantization lost."""
    norm = float(np.linalg.norm(w.astype(np.float64)))
    return float(np.linalg.norm(w.astype(np.float64) - restored.astype(np.float64))) / norm if norm else 0.0


# --- nodes -----------------------------------------------------------------------------------


@dataclass
class NodeMaker:
    """Base of the int8 passes' builders: makes nodes and initializers in ``graph``, named fresh by ``names``."""

    graph: ir.Graph
    names: FreshNames

    def _add(self, name: str, array: np.ndarray) -> ir.Value:
        return add_initializer(self.graph, self.names(name), array)


def typed(value: ir.Value, name: str, dtype: ir.DataType, shape: ir.Shape | None) -> None:
    """Name and type a made node's output."""
    value.name = name
    value.dtype = dtype
    value.shape = shape


class QuantizedResult(ir.passes.PassResult):
    """What an int8 pass did: the nodes it rewrote (by name)."""

    def __init__(self, model: ir.Model, quantized: list[str]) -> None:
        super().__init__(model, modified=bool(quantized))
        self.quantized = quantized


def dequantize_node(
    graph: ir.Graph,
    names: FreshNames,
    name: str,
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    *,
    axis: int,
    block_size: int | None = None,
) -> ir.Node:
    """A DequantizeLinear over new initializers ``NAME_quantized``/``_scale``/``_zero_point``.

    Its output is unnamed: the caller gives it the name of the weight it replaces.
    """
    inputs = [
        add_initializer(graph, names(f"{name}_quantized"), q),
        add_initializer(graph, names(f"{name}_scale"), scale),
    ]
    if zero_point is not None:
        inputs.append(add_initializer(graph, names(f"{name}_zero_point"), zero_point))
    attributes: dict[str, int] = {"axis": axis}
    if block_size is not None:
        attributes["block_size"] = block_size
    node = ir.node("DequantizeLinear", inputs, attributes, name=f"{name}_DequantizeLinear")
    node.outputs[0].dtype = ir.DataType.from_numpy(scale.dtype)
    node.outputs[0].shape = ir.Shape(q.shape)
    return node


def blocked_dequantize_node(graph: ir.Graph, names: FreshNames, name: str, b: Blocked) -> ir.Node:
    return dequantize_node(graph, names, name, b.q, b.scale, b.zero_point, axis=0, block_size=b.block_size)


def per_channel_dequantize_node(graph: ir.Graph, names: FreshNames, name: str, p: PerChannel) -> ir.Node:
    return dequantize_node(graph, names, name, p.q, p.scale, None, axis=p.axis)


def pack_matmul_nbits(b: Blocked) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(B, scales, zero_points) as com.microsoft MatMulNBits reads them.

    B is uint8 [N, blocks, block_size * bits / 8], each column's blocks in a row, two 4-bit
    values per byte low nibble first; scales [N, blocks]; zero points uint8 [N, ceil(blocks *
    bits / 8)] packed the same way. A symmetric weight is stored offset by 2^(bits-1) with no
    zero points (MatMulNBits' default zero point is exactly that offset). A short last block
    is padded with zero points (it multiplies nothing: K tells the kernel where to stop). Float zero
    points (a weight :func:`on_grid`) are [N, blocks] in the scales' type, unpacked.
    """
    k, n = b.q.shape
    blocks = b.scale.shape[0]
    offset = 1 << (b.bits - 1)
    q = b.q.astype(np.int32) + (offset if b.symmetric else 0)
    padded = np.empty((blocks * b.block_size, n), dtype=np.int32)
    pad_value = offset if b.zero_point is None else np.repeat(b.zero_point.astype(np.int32), b.block_size, axis=0)
    padded[:] = pad_value
    padded[:k] = q
    per_column = padded.T.reshape(n, blocks, b.block_size)
    scales = np.ascontiguousarray(b.scale.T)
    if b.bits == 4:
        packed = (per_column[..., 0::2] | (per_column[..., 1::2] << 4)).astype(np.uint8)
    else:
        packed = per_column.astype(np.uint8)
    zero_points = None
    if b.zero_point is not None and b.float_zero_point:
        # MatMulNBits reads zero points of the scales' type unpacked: (q - zp) * scale
        zero_points = np.ascontiguousarray(b.zero_point.T)
    elif b.zero_point is not None:
        zp = b.zero_point.astype(np.int32).T  # [N, blocks]
        if b.bits == 4:
            if blocks % 2:
                zp = np.concatenate([zp, np.zeros((n, 1), np.int32)], axis=1)
            zero_points = (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8)
        else:
            zero_points = zp.astype(np.uint8)
    return packed, scales, zero_points


def block_sums_nodes(graph: ir.Graph, names: FreshNames, x: ir.Value, k: int, block_size: int) -> list[ir.Node] | None:
    """``ReduceSum(Reshape(x, [.., k / block_size, block_size]), -1)``: the sums of ``x`` (last axis ``k``, the
    weight's K) over each block, what :func:`grid_matmul_nodes` multiplies the block offsets by (one per input,
    for all the weights that read it). None when ``x``'s rank is unknown."""
    x_shape = x.shape
    if x_shape is None or not len(x_shape) or k % block_size:
        return None
    rank = len(x_shape)
    label = x.name or "input"
    shape = add_initializer(
        graph, names(f"{label}_blocks_shape"), np.array([0] * (rank - 1) + [k // block_size, block_size], np.int64)
    )
    axes = add_initializer(graph, names(f"{label}_blocks_axis"), np.array([-1], np.int64))
    grouped = ir.node("Reshape", [x, shape], name=f"{label}_blocks")
    sums = ir.node("ReduceSum", [grouped.outputs[0], axes], {"keepdims": 0}, name=f"{label}_block_sums")
    for node in (grouped, sums):
        set_dtype(node.outputs[0], x.dtype)
    sums.outputs[0].shape = ir.Shape([*x_shape[:-1], k // block_size])
    return [grouped, sums]


def grid_matmul_nodes(
    graph: ir.Graph, names: FreshNames, name: str, x: ir.Value, sums: ir.Value, b: Blocked, accuracy_level: int | None
) -> list[ir.Node]:
    """``x @ w`` for ``b`` a weight :func:`on_grid` (each block ``low + step * q``), exactly and at the speed
    of MatMulNBits' integer kernels: ``MatMulNBits(x, q, step)`` with its default zero point 2^(bits-1), plus
    each block's offset ``low + step * 2^(bits-1)`` [blocks, N] times ``sums``, the sums of ``x`` over the
    block's rows (:func:`block_sums_nodes`). Float zero points say the same thing to MatMulNBits itself, but
    onnxruntime runs them far slower (docs/quantize.md has the measurement).
    The last node's output is ``x @ w``."""
    product = matmul_nbits_node(graph, names, name, x, _grid_levels(b), accuracy_level)
    weights = add_initializer(graph, names(f"{name}_offsets"), _grid_offsets(b))
    offset = ir.node("MatMul", [sums, weights], name=f"{name}_block_offsets")
    total = ir.node("Add", [product.outputs[0], offset.outputs[0]], name=f"{name}_on_grid")
    for node in (product, offset, total):
        set_dtype(node.outputs[0], x.dtype)
    return [product, offset, total]


def grid_dequantize_nodes(graph: ir.Graph, names: FreshNames, name: str, b: Blocked) -> list[ir.Node]:
    """The weight ``b`` :func:`on_grid` (each block ``low + step * q``), exactly, in standard ops: its levels behind
    a blocked DequantizeLinear (signed, no zero point: ``step * (q - 2^(bits-1))``) plus each block's offset
    ``low + step * 2^(bits-1)``, added over [blocks, block, N]. Every input is a constant, so onnxruntime folds
    the four nodes into the fp32 weight at load (``session.disable_quant_qdq=1``, as for any ``qdq`` weight).
    The last node's output is the weight; unnamed."""
    k, n = b.q.shape
    blocks = k // b.block_size
    dq = blocked_dequantize_node(graph, names, name, _grid_levels(b))
    grouped_shape = add_initializer(graph, names(f"{name}_blocks_shape"), np.array([blocks, b.block_size, n], np.int64))
    offsets = add_initializer(graph, names(f"{name}_offsets"), _grid_offsets(b)[:, None, :])
    weight_shape = add_initializer(graph, names(f"{name}_shape"), np.array([k, n], np.int64))
    grouped = ir.node("Reshape", [dq.outputs[0], grouped_shape], name=f"{name}_blocks")
    total = ir.node("Add", [grouped.outputs[0], offsets], name=f"{name}_block_offsets")
    weight = ir.node("Reshape", [total.outputs[0], weight_shape], name=f"{name}_on_grid")
    for node, shape in ((grouped, [blocks, b.block_size, n]), (total, [blocks, b.block_size, n]), (weight, [k, n])):
        set_dtype(node.outputs[0], ir.DataType.from_numpy(b.scale.dtype))
        node.outputs[0].shape = ir.Shape(shape)
    return [dq, grouped, total, weight]


def _grid_levels(b: Blocked) -> Blocked:
    """A grid's levels alone, signed (``q - 2^(bits-1)``, no zero point): what MatMulNBits runs at its integer
    kernels' speed with its default zero point, and what a DequantizeLinear restores without one."""
    middle = 1 << (b.bits - 1)
    signed = {4: np.dtype(ml_dtypes.int4), 8: np.dtype(np.int8)}[b.bits]
    return Blocked((b.q.astype(np.int32) - middle).astype(signed), b.scale, None, b.bits, b.block_size)


def _grid_offsets(b: Blocked) -> np.ndarray:
    """[blocks, N] what each block of a grid adds to its levels (:func:`_grid_levels`): ``low + step * 2^(bits-1)``."""
    assert b.zero_point is not None  # a weight on a grid has its offsets
    middle = 1 << (b.bits - 1)
    zero_point = b.zero_point.astype(np.float64)
    return ((middle - zero_point) * b.scale.astype(np.float64)).astype(b.scale.dtype)


def matmul_nbits_node(
    graph: ir.Graph, names: FreshNames, name: str, x: ir.Value, b: Blocked, accuracy_level: int | None
) -> ir.Node:
    """``x @ w`` as one com.microsoft MatMulNBits over the packed weight; output unnamed."""
    packed, scales, zero_points = pack_matmul_nbits(b)
    k, n = b.q.shape
    inputs = [
        x,
        add_initializer(graph, names(f"{name}_nbits"), packed),
        add_initializer(graph, names(f"{name}_scale"), scales),
    ]
    if zero_points is not None:
        inputs.append(add_initializer(graph, names(f"{name}_zero_point"), zero_points))
    attributes = {"K": k, "N": n, "bits": b.bits, "block_size": b.block_size}
    if accuracy_level is not None:
        attributes["accuracy_level"] = accuracy_level
    return ir.node("MatMulNBits", inputs, attributes, domain="com.microsoft", name=f"{name}_MatMulNBits")
