"""Run a rule set and say what happened: how often it matched, or why it never did."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRuleSet

from onnxsmith.irutil.names import node_label


@dataclass
class RuleOutcome:
    """One rule set applied to one model."""

    name: str
    matched: int
    #: Why it did not match (the most complete attempt), empty when it matched.
    reason: str = ""

    def row(self) -> dict:
        return {"rule": self.name, "matched": self.matched, "why not": self.reason}


def apply_rules(model: ir.Model, name: str, *stages: RewriteRuleSet) -> RuleOutcome:
    """Apply each rule set in turn to ``model``, in place; a rule that does not match changes nothing.

    Stages exist for rules that must not compete for the same nodes (a general
    variant after the more specific ones), or that match what an earlier stage made.
    After a stage that matched, the Identities it left are bypassed: a no-op rewrite (a
    pair of transposes that cancel, a Reshape to the shape it has) leaves one, and it
    would hide the values around it from the next pattern.
    """
    matched = 0
    for rules in stages:
        count = rules.apply_to_model(model)
        if count:
            bypass_identities(model.graph)
        matched += count
    if matched:
        return RuleOutcome(name, matched)
    return RuleOutcome(name, 0, explain(model, stages[0]))


def would_match(model: ir.Model, *stages: RewriteRuleSet) -> bool:
    """Whether any rule of ``stages`` matches a node of the main graph as it is (nothing is rewritten)."""
    return any(
        rule.try_rewrite(model, model.graph, node) is not None
        for rules in stages
        for rule in rules.rules
        for node in model.graph
    )


def bypass_identities(graph: ir.Graph) -> None:
    """Readers of an Identity's result read its input instead (this graph; graph outputs stay)."""
    for node in list(graph):
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and not node.outputs[0].is_graph_output():
            node.outputs[0].replace_all_uses_with(node.inputs[0])
            graph.remove(node, safe=True)


def explain(model: ir.Model, rules: RewriteRuleSet) -> str:
    """The reason the best partial match of any rule in ``rules`` failed (the model is not changed)."""
    tracer = MatchingTracer()
    rules.apply_to_model(model, tracer=tracer)
    best = None
    for matches in tracer.best_matches_map.values():
        for match in matches:
            if match.status == MatchStatus.SUCCESS:
                continue
            if best is None or match.score() > best.score():
                best = match
    if best is None:
        return "pattern not found"
    reason = best.match_result.reason or "pattern differs"
    if best.status == MatchStatus.CONDITION_FAILED:
        return f"refused at {node_label(best.root_node)}: {reason}"
    return f"closest match at {node_label(best.root_node)} differs: {reason}"
