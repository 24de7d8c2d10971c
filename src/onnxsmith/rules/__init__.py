"""Rewrite rules: onnxscript-rewriter patterns, one fusion per module.

A rule is a pattern, a check that explains in words why a match is refused,
and a rewrite. Where onnxscript's own ORT fusions fit they are reused as they
are (attention, skip_layernorm, bias_gelu); the others are written here in the
same style. :mod:`onnxsmith.rules.apply` runs a rule set and reports what
matched, how often, and why the rest did not.
"""
