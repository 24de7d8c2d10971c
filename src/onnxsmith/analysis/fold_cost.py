"""What folding a computed value into a stored constant adds to the file: one rule for every folding pass.

Folding replaces the nodes that compute a value from constants by the value itself. That
pays where the result is no bigger than what dies with those nodes (shape arithmetic: a
few int64s from a few int64s). It costs where it is bigger: an int8 weight dequantised
to fp32 stores four times its bytes (MiniLM int8: 2.4x the file); a Transpose, Identity
or Unsqueeze of a weight that other nodes also read stores that weight twice (rxnmap's
shared blocks, silero's LSTM weights read by two If branches); an Expand stores what it
broadcasts (HITNet's index grid). Quantised weights stay quantised and shared weights
stay shared because the same rule sees all of these as bytes added to the file.

:func:`fold_cost` measures a fold (what it would store, what it frees, what it reads);
:func:`fold_refusal` is the rule: a fold may add at most ``limit`` bytes (what it
stores, less the constants only the replaced nodes read), and a weight stored narrow and
widened by a Cast where it is read (fp16's weights of nodes computing in fp32) stays so
whatever the limit: the precision engine chose that storage. The default limit,
:data:`SMALL_FOLD`, lets shape vectors, scalars and small tables fold; a caller asked for
more (``shrink --max-fold-growth``) passes more. A table made from shapes and scalars
alone (:attr:`FoldCost.generated`: RoPE angles, masks, position ids) may have a limit of
its own: ``fuse`` stores those its fused operators read as inputs, never a weight's copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx_ir as ir

#: A fold may add this many bytes by default: shape vectors, scalars, small index tables.
SMALL_FOLD = 4096
#: How :func:`fold_refusal` begins when the fold would widen a weight stored narrow.
WIDENED_REFUSAL = "it would store a weight stored narrow widened"


@dataclass(frozen=True)
class FoldCost:
    """The bytes at stake when ``replaced`` values become one stored constant each."""

    stored: int  # what the folded constant(s) would store
    freed: int  # constants read only by the nodes the fold removes
    read: int  # every constant the removed nodes read (freed or still read elsewhere)
    #: a weight stored narrow that a removed Cast widens ("FLOAT16 -> FLOAT"), "" if none
    widened: str = ""

    @property
    def growth(self) -> int:
        return self.stored - self.freed

    @property
    def generated(self) -> bool:
        """Made from shapes and scalars (Range, ConstantOfShape, an Expand of a few values), not from weights."""
        return self.read <= SMALL_FOLD


def fold_cost(replaced: Iterable[ir.Value], stored: int) -> FoldCost:
    """The cost of replacing every use of ``replaced`` by a stored constant of ``stored`` bytes in all.

    The nodes that die are those whose outputs are all replaced or read only by nodes that
    die (graph outputs keep their producer); the constants freed are those that only dying
    nodes read. A value read inside a subgraph keeps its producer (counted as not freed).
    """
    replaced = set(replaced)
    dead: set[ir.Node] = set()
    pending = [v.producer() for v in replaced if v.producer() is not None]
    while pending:
        node = pending.pop()
        if node in dead or not _dies(node, replaced, dead):
            continue
        dead.add(node)
        pending.extend(v.producer() for v in node.inputs if v is not None and v.producer() is not None)
    read = freed = 0
    widened = ""
    seen: set[ir.Value] = set()
    for node in dead:
        widened = widened or _widening(node)
        for value in node.inputs:
            if value is None or value in seen:
                continue
            seen.add(value)
            nbytes = _constant_bytes(value)
            if nbytes is None:
                continue
            read += nbytes
            producer = value.producer()
            if producer is None:  # an initializer: freed when nothing else reads it
                if not value.is_graph_output() and all(user in dead for user, _ in value.uses()):
                    freed += nbytes
            elif producer in dead:  # a Constant node that dies
                freed += nbytes
    return FoldCost(stored=stored, freed=freed, read=read, widened=widened)


def fold_refusal(cost: FoldCost, limit: int = SMALL_FOLD, *, generated_limit: int | None = None) -> str | None:
    """Why the fold must not happen (it would add more than its limit to the file), or None.

    ``limit`` applies to every fold; ``generated_limit`` (default: ``limit``) instead to a
    table made from shapes and scalars alone.
    """
    if cost.widened:  # the precision engine stored it narrow (read through a Cast in fp32): so it stays
        return f"{WIDENED_REFUSAL} ({cost.widened}); it stays a Cast"
    if cost.generated and generated_limit is not None:
        limit = generated_limit
    if cost.growth <= limit:
        return None
    if cost.stored > cost.read:
        why = f"it would store {cost.stored} bytes computed from {cost.read} bytes of constants"
    else:
        why = f"it would store a second copy of constants other nodes read ({cost.stored} bytes)"
    return f"{why}: +{cost.growth} bytes, over the {limit}-byte limit; it stays computed at run time"


#: Float types by width: a Cast from a narrower to a wider one widens.
_FLOAT_WIDTH = {ir.DataType.FLOAT16: 16, ir.DataType.BFLOAT16: 16, ir.DataType.FLOAT: 32, ir.DataType.DOUBLE: 64}


def _widening(node: ir.Node) -> str:
    """ "FLOAT16 -> FLOAT" when ``node`` is a Cast widening a constant float weight, else ""."""
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return ""
    source = node.inputs[0]
    to = ir.DataType(node.attributes.get_int("to", 0))
    if _constant_bytes(source) is None or source.dtype not in _FLOAT_WIDTH or to not in _FLOAT_WIDTH:
        return ""
    return f"{source.dtype.name} -> {to.name}" if _FLOAT_WIDTH[to] > _FLOAT_WIDTH[source.dtype] else ""


def _dies(node: ir.Node, replaced: set[ir.Value], dead: set[ir.Node]) -> bool:
    for out in node.outputs:
        if out in replaced:
            continue
        if out.is_graph_output() or any(user not in dead for user, _ in out.uses()):
            return False
    return True


def _constant_bytes(value: ir.Value) -> int | None:
    """Bytes of an initializer or a Constant node's tensor (None: not a constant)."""
    if value.is_graph_input():
        return None
    producer = value.producer()
    if producer is None:
        tensor = value.const_value
    elif producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
        tensor = ir.convenience.get_const_tensor(value)
    else:
        return None
    return None if tensor is None else tensor.nbytes
