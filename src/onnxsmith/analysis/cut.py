"""Where ``extract`` cuts a graph, and what is wrong with a cut before anything is built.

A cut is a list of tensors that become the piece's inputs and a list that become
its outputs. It is refused, naming the tensor at fault, when

* a name is not a tensor of the graph (the nearest names are suggested);
* a tensor is both an input and an output;
* an output lies upstream of an input: the piece would have to run before itself
  (the path from the output to the input is named);
* an output needs a tensor the inputs do not determine: the message names the
  tensor where the outside branch enters and the graph input behind it.
"""

from __future__ import annotations

import difflib
import os
from collections import deque
from dataclasses import dataclass

import onnx_ir as ir

from onnxsmith.core.errors import UsageError
from onnxsmith.irutil.walk import reachable, subgraphs_of


@dataclass
class Cut:
    inputs: list[ir.Value]
    outputs: list[ir.Value]
    #: inputs no requested output reads (kept as inputs, but worth saying)
    unused_inputs: list[str]


def reads(node: ir.Node) -> list[ir.Value]:
    """The values of the node's graph it reads: its inputs and what its subgraphs capture."""
    values = [v for v in node.inputs if v is not None]
    for sub in subgraphs_of(node):
        for inner in ir.traversal.RecursiveGraphIterator(sub):
            values.extend(v for v in inner.inputs if v is not None and v.graph is node.graph)
    return values


def plan_cut(model: ir.Model, input_names: list[str], output_names: list[str], path: str | os.PathLike) -> Cut:
    graph = model.graph
    values = ir.convenience.create_value_mapping(graph, include_subgraphs=False)
    if not output_names:
        raise UsageError("give at least one tensor to --outputs", path)
    inputs = [_lookup(values, name, "--inputs", path) for name in _unique(input_names, "--inputs", path)]
    outputs = [_lookup(values, name, "--outputs", path) for name in _unique(output_names, "--outputs", path)]
    both = [v.name for v in outputs if v in inputs]
    if both:
        raise UsageError(f"'{both[0]}' is both an input and an output of the cut", path)
    _refuse_cycles(inputs, outputs, path)
    _refuse_missing(graph, inputs, outputs, path)
    upstream = _upstream_of(outputs, stop=set(inputs))
    unused = [v.name for v in inputs if v not in upstream]
    return Cut(inputs, outputs, unused)


def _unique(names: list[str], flag: str, path) -> list[str]:
    seen = set()
    for name in names:
        if name in seen:
            raise UsageError(f"{flag} names '{name}' twice", path)
        seen.add(name)
    return names


def _lookup(values: dict[str, ir.Value], name: str, flag: str, path) -> ir.Value:
    if name in values:
        return values[name]
    near = difflib.get_close_matches(name, list(values), n=3, cutoff=0.5)
    hint = f"nearest: {', '.join(near)}" if near else "no similar names; `onnxsmith inspect` lists the inputs"
    raise UsageError(f"{flag}: no tensor named '{name}' in the graph ({hint})", path)


def _producer_reads(value: ir.Value) -> list[ir.Value]:
    producer = value.producer()
    return [] if producer is None else reads(producer)


def _upstream_of(values: list[ir.Value], stop: set[ir.Value]) -> set[ir.Value]:
    """Everything ``values`` are computed from (themselves included), not looking past ``stop``."""
    return reachable(values, lambda v: () if v in stop else _producer_reads(v))


def _refuse_cycles(inputs: list[ir.Value], outputs: list[ir.Value], path) -> None:
    """An output upstream of an input: the piece's result would be needed to make its own input."""
    wanted = set(outputs)
    came_from: dict[ir.Value, ir.Value | None] = {}
    queue: deque[ir.Value] = deque()
    for value in inputs:
        came_from.setdefault(value, None)
        queue.append(value)
    while queue:
        value = queue.popleft()
        for upstream in _producer_reads(value):
            if upstream in came_from:
                continue
            came_from[upstream] = value
            if upstream in wanted:
                chain = [upstream]
                while came_from[chain[-1]] is not None:
                    chain.append(came_from[chain[-1]])
                route = " -> ".join(v.name or "?" for v in chain)
                raise UsageError(
                    f"the cut has a cycle: output '{upstream.name}' feeds input '{chain[-1].name}' "
                    f"({route}), so the piece would need its own result; move '{upstream.name}' or "
                    f"'{chain[-1].name}'",
                    path,
                )
            queue.append(upstream)


def _refuse_missing(graph: ir.Graph, inputs: list[ir.Value], outputs: list[ir.Value], path) -> None:
    """Every output must be computable from the inputs and constants alone."""
    cut = set(inputs)
    free = {v for v in graph.inputs if not v.is_initializer() and v not in cut}  # not given: unknown
    if not free:
        return
    needed = _upstream_of(outputs, stop=cut)
    undetermined: set[ir.Value] = set(free & needed)
    from_cut: set[ir.Value] = set(cut)
    changed = True
    while changed:  # one sweep when the graph is in topological order, as it should be
        changed = False
        for node in graph:
            read = reads(node)
            for out in node.outputs:
                if out in cut:
                    continue
                if out not in undetermined and any(v in undetermined for v in read):
                    undetermined.add(out)
                    changed = True
                if out not in from_cut and any(v in from_cut for v in read):
                    from_cut.add(out)
                    changed = True
    for output in outputs:
        if output not in undetermined:
            continue
        entering = _where_outside_enters(output, undetermined, from_cut)
        sources = sorted(v.name for v in _upstream_of([entering], stop=cut) & free)
        if entering is output and output not in free:
            raise UsageError(
                f"output '{output.name}' does not depend on the given inputs: it is computed from graph "
                f"input(s) {', '.join(repr(s) for s in sources[:3])}; add those (or tensors between) to --inputs",
                path,
            )
        if entering in free:
            raise UsageError(
                f"output '{output.name}' needs graph input '{entering.name}', which --inputs does not "
                f"include; add '{entering.name}' to --inputs",
                path,
            )
        raise UsageError(
            f"output '{output.name}' needs '{entering.name}', which is computed from graph input(s) "
            f"{', '.join(repr(s) for s in sources[:3])} and not from the given inputs; add "
            f"'{entering.name}' to --inputs",
            path,
        )


def _where_outside_enters(output: ir.Value, undetermined: set[ir.Value], from_cut: set[ir.Value]) -> ir.Value:
    """The first tensor (walking up from ``output``) that the cut does not reach but the piece reads."""
    if output not in from_cut:
        return output
    seen: set[ir.Value] = set()
    queue: deque[ir.Value] = deque([output])
    while queue:
        value = queue.popleft()
        for upstream in _producer_reads(value):
            if upstream in seen or upstream not in undetermined:
                continue
            seen.add(upstream)
            if upstream not in from_cut:
                return upstream
            queue.append(upstream)
    return output
