"""The LM gate: a language-model variant judged by what it predicts, not by its raw logits.

A quantized LM's logits are not equal to the source's within any useful atol: 4-bit
weights move every logit a little. What must hold is that it predicts the same
next-token *distributions*. The gate (:func:`compare_lm`) measures, at every position
of some token sequences:

* the KL divergence KL(p_source || p_variant) of the next-token distributions, in nats;
* top-1 agreement: how often both models rank the same token first;

and fails on NaN/inf, on a mean KL above ``max_kl`` or on top-1 agreement below
``min_top1``. The sequences are sampled from the source itself
(:func:`sample_sequences`): on text drawn from p_source, the variant's expected loss
exceeds the source's by exactly KL(p_source || p_variant), so the KL bound is a bound
on the loss the variant adds on the source's own kind of text — no dataset needed,
and no out-of-distribution noise as random token ids would give.

A KV cache is judged by what it is for, the next steps: the variant reads the first half of
each sequence in one run, then the rest one token per run through its own cache, and those
steps' next-token distributions are held to the same bounds against the source's over the whole
sequence. The cache outputs themselves must have the source's shape and stay finite; their own
cosine is no measure (a 4-bit key cache has 0.98 while its next steps agree to the last token).

What a user sees of a decoder is what it generates: from the first tokens of each sequence, both models
generate greedily (:meth:`LMRunner.greedy`, through their own caches) and the gate holds the share of the
source's tokens the variant repeats before its first divergence to ``min_generation``. One divergence
ends the comparison (after it the two continue different texts), so this measures how long the variant
stays on the source's path, where a KL or top-1 mean does not see whether errors come early.

A variant that returns only the last position's logits is run on every prefix of
the sequences, so it is judged at as many positions as the source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from onnxsmith.analysis.lm_signature import IDS
from onnxsmith.core.errors import InputError
from onnxsmith.settings.gate import DEFAULT_MIN_GENERATION
from onnxsmith.tasks.lm.feeding import LMRunner, log_softmax
from onnxsmith.verify.compare import Comparison, Judgement
from onnxsmith.verify.gate import Bounds, judge_output

#: Defaults of the gate: see the module doc and docs/quantize.md.
DEFAULT_MAX_KL = 0.1
DEFAULT_MIN_TOP1 = 0.8
#: Sequences shorter than this are not also decoded step by step through the cache.
MIN_CACHE_SEQUENCE = 4
#: The sequences the gate samples from the source when it is given none (quantize's defaults too).
GATE_SAMPLES = 4
GATE_LENGTH = 32
#: Greedy generation: from the first PROMPT_TOKENS of each sequence, GENERATED_TOKENS new ones.
PROMPT_TOKENS = 4
GENERATED_TOKENS = 16


@dataclass
class Agreement:
    """How a variant's next-token distributions compare with the reference's, position by position."""

    kl: np.ndarray  # KL(p_ref || p_test) per position, nats
    top1: np.ndarray  # 1 where both rank the same token first
    entropy: np.ndarray  # the reference's entropy per position, nats

    @classmethod
    def of(cls, ref_logits: np.ndarray, test_logits: np.ndarray) -> Agreement:
        ref = log_softmax(ref_logits).reshape(-1, ref_logits.shape[-1])
        test = log_softmax(test_logits).reshape(-1, test_logits.shape[-1])
        p = np.exp(ref)
        kl = np.sum(p * (ref - test), axis=-1)
        top1 = (ref.argmax(-1) == test.argmax(-1)).astype(np.float64)
        entropy = -np.sum(p * ref, axis=-1)
        return cls(np.maximum(kl, 0.0), top1, entropy)

    @classmethod
    def concat(cls, parts: list[Agreement]) -> Agreement:
        return cls(*(np.concatenate([getattr(a, f) for a in parts]) for f in ("kl", "top1", "entropy")))


def sample_sequences(
    path: str | os.PathLike, *, count: int = 4, length: int = 32, seed: int = 0, temperature: float = 1.0
) -> np.ndarray:
    """``count`` sequences of ``length`` tokens sampled from the model itself (the first uniformly)."""
    lm = LMRunner(path)
    rng = np.random.default_rng(seed)
    first = lm.logits(np.zeros((1, 1), dtype=np.int64))
    vocab = first.shape[-1]
    ids = rng.integers(0, vocab, size=(count, 1))
    while ids.shape[1] < length:
        logp = log_softmax(lm.logits(ids)[:, -1] / temperature)
        p = np.exp(logp)
        u = rng.random((count, 1))
        nxt = np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), vocab - 1)
        ids = np.concatenate([ids, nxt[:, None]], axis=1)
    return ids.astype(np.int64)


@dataclass(frozen=True)
class Generation:
    """Greedy generation of the variant against the source's from the same prompts."""

    agreed: tuple[int, ...]  # per prompt, the new tokens equal to the source's before the first divergence
    new_tokens: int

    @classmethod
    def of(cls, source: np.ndarray, variant: np.ndarray) -> Generation:
        """From both models' new ids [prompts, new_tokens]."""
        differs = source != variant
        agreed = np.where(differs.any(axis=1), differs.argmax(axis=1), source.shape[1])
        return cls(tuple(int(a) for a in agreed), int(source.shape[1]))

    @property
    def share(self) -> float:
        """The mean share of the source's tokens repeated before the first divergence."""
        return float(np.mean(self.agreed)) / self.new_tokens

    def describe(self) -> str:
        return (
            f"greedy generation from {len(self.agreed)} prompts: {', '.join(map(str, self.agreed))} of "
            f"{self.new_tokens} tokens the source's before the first divergence"
        )

    def problems(self, min_share: float) -> list[str]:
        """The bound on :attr:`share`: a problem when it fails."""
        if self.share >= min_share:
            return []
        return [
            f"greedy generation repeats {self.share:.0%} of the source's tokens before the first divergence "
            f"< gate {min_share:.0%} ({', '.join(map(str, self.agreed))} of {self.new_tokens} "
            f"from {len(self.agreed)} prompts)"
        ]

    def to_json(self) -> dict:
        return {"agreed": list(self.agreed), "new_tokens": self.new_tokens, "share": self.share}


def generate_both(ref: LMRunner, cand: LMRunner, prompts: np.ndarray) -> Generation:
    """Both models' greedy generation of :data:`GENERATED_TOKENS` from ``prompts`` [count, length]."""
    return Generation.of(ref.greedy(prompts, GENERATED_TOKENS), cand.greedy(prompts, GENERATED_TOKENS))


def generation_judgement(
    reference: str | os.PathLike, candidate: str | os.PathLike, min_share: float | None = None
) -> Judgement:
    """Greedy generation as a judgement of a variant the one gate judged output by output (fp16, fuse, ... of a
    cached decoder, ``compare`` of two): from :data:`GATE_SAMPLES` prompts of :data:`PROMPT_TOKENS` tokens the
    source writes; ``min_share`` None: the default (``--min-generation``)."""
    min_share = DEFAULT_MIN_GENERATION if min_share is None else min_share
    ref, cand = LMRunner(reference), LMRunner(candidate)
    prompts = sample_sequences(reference, count=GATE_SAMPLES, length=PROMPT_TOKENS)
    generation = generate_both(ref, cand, prompts)
    problems = generation.problems(min_share)
    return Judgement(
        "generation",
        not problems,
        f"{generation.describe()} (gate ≥ {min_share:.0%} on average)",
        problems[0] if problems else "",
        {"generation": generation.to_json(), "min_generation": min_share},
    )


@dataclass
class LMComparison(Comparison):
    """A :class:`Comparison` whose verdict is the LM gate's (see the module doc)."""

    positions: int = 0
    mean_kl: float = 0.0
    max_kl: float = 0.0
    top1: float = 1.0
    entropy: float = 0.0
    gate: dict[str, float] = field(default_factory=dict)
    #: the steps decoded through the variant's own KV cache: positions, mean KL, top-1 (empty: no cache)
    cache_steps: dict[str, float] = field(default_factory=dict)
    #: greedy generation against the source's (None: sequences too short to prompt)
    generation: Generation | None = None
    #: what the token ids were, in words: "4 sequences the source wrote"
    text: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def failures(self) -> list[str]:
        return list(self.problems)

    def summary(self) -> str:
        cache = self.cache_steps
        steps = (
            f"; through its KV cache, {cache['positions']} steps: mean KL {cache['mean_kl']:.4f}, "
            f"top-1 {cache['top1']:.1%}"
            if cache
            else ""
        )
        generation = (
            f"; {self.generation.describe()} (gate ≥ {self.gate['min_generation']:.0%} on average)"
            if self.generation is not None
            else ""
        )
        return (
            f"{self.positions} positions of {self.text}: mean KL {self.mean_kl:.4f} nats "
            f"(gate ≤ {self.gate['max_kl']:g}), "
            f"top-1 agreement {self.top1:.1%} (gate ≥ {self.gate['min_top1']:.0%}); "
            f"the source's own entropy there {self.entropy:.3f} nats{steps}{generation}"
        )

    def to_json(self) -> dict:
        """A comparison's JSON with the LM gate's own fields (its ``gate`` in place of the one gate's bounds)."""
        inherited = {f.name for f in fields(Comparison)}
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in inherited}
        own["generation"] = None if self.generation is None else self.generation.to_json()
        return {**super().to_json(), **own}


def compare_lm(
    reference: str | os.PathLike,
    candidate: str | os.PathLike,
    feeds_list: list[dict[str, np.ndarray]] | None,
    *,
    max_kl: float = DEFAULT_MAX_KL,
    min_top1: float = DEFAULT_MIN_TOP1,
    min_generation: float = DEFAULT_MIN_GENERATION,
    candidate_config: dict[str, str] | None = None,
) -> LMComparison:
    """The LM gate: ``candidate`` against ``reference`` on the token ids of ``feeds_list`` (None: sequences
    sampled from the reference, :data:`GATE_SAMPLES` of :data:`GATE_LENGTH` tokens), in one run, for a variant
    with a KV cache step by step through it, and in greedy generation (see the module doc)."""
    ref = LMRunner(reference)
    feeds_list, text = _sequences(ref, feeds_list)
    cand = LMRunner(candidate, config=candidate_config)
    comparison = LMComparison(
        reference=Path(reference).name,
        candidate=Path(candidate).name,
        modes={"reference": "native", "candidate": _mode(candidate_config)},
        samples=len(feeds_list),
        gate={"max_kl": max_kl, "min_top1": min_top1, "min_generation": min_generation},
        text=text,
    )
    parts, steps, output_problems = [], [], []
    for feeds in feeds_list:
        ids = feeds[IDS]
        ref_out = ref.run(ids)
        cand_out = cand.run(ids)
        ref_logits = ref_out[ref.sig.logits]
        cand_logits = cand.all_logits(ids) if cand.sig.last_only and ids.shape[1] > 1 else cand_out[cand.sig.logits]
        if cand_logits.shape != ref_logits.shape:
            raise InputError(f"logits have shape {cand_logits.shape}, the source's {ref_logits.shape}", candidate)
        parts.append(Agreement.of(ref_logits, cand_logits))
        if cand.sig.past and ids.shape[1] >= MIN_CACHE_SEQUENCE:
            first = ids.shape[1] // 2
            steps.append(Agreement.of(ref_logits[:, first:], _through_cache(cand, ids, first)))
        for name, value in ref_out.items():
            if name not in cand_out:
                raise InputError(f"has no output named '{name}' (the source has it)", candidate)
            test = cand_logits if name == ref.sig.logits else cand_out[name]
            if test.shape != value.shape:
                raise InputError(f"output '{name}' has shape {test.shape}, the source's {value.shape}", candidate)
            diff = judge_output(name, value[None], test[None], Bounds.for_format())  # its measurements; judged here
            ok = diff.nonfinite_test <= diff.nonfinite_ref
            if not ok and name != ref.sig.logits:
                output_problems.append(f"output '{name}' has NaN/inf values the source's don't")
            comparison.outputs.append(replace(diff, passed=ok, failed=[], needed={}))
    cache_problems = []
    if steps:
        cached = Agreement.concat(steps)
        comparison.cache_steps = {
            "positions": int(cached.kl.size),
            "mean_kl": float(cached.kl.mean()),
            "top1": float(cached.top1.mean()),
        }
        cache_problems = _agreement_problems(cached, max_kl, min_top1, " through the KV cache")
    agreement = Agreement.concat(parts)
    comparison.positions = int(agreement.kl.size)
    comparison.mean_kl = float(agreement.kl.mean())
    comparison.max_kl = float(agreement.kl.max())
    comparison.top1 = float(agreement.top1.mean())
    comparison.entropy = float(agreement.entropy.mean())
    logits_diffs = [o for o in comparison.outputs if o.name == ref.sig.logits]
    if any(o.nonfinite_test > o.nonfinite_ref for o in logits_diffs) or not np.isfinite(comparison.mean_kl):
        logits_problems = ["the logits have NaN/inf values the source's don't"]
    else:
        logits_problems = _agreement_problems(agreement, max_kl, min_top1, "")
    prompts = [feeds[IDS][:, :PROMPT_TOKENS] for feeds in feeds_list if feeds[IDS].shape[1] >= PROMPT_TOKENS]
    comparison.generation = generation = generate_both(ref, cand, np.concatenate(prompts)) if prompts else None
    generation_problems = [] if generation is None else generation.problems(min_generation)
    comparison.problems = logits_problems + cache_problems + generation_problems + output_problems
    lm_ok = not any("KL" in p or "top-1" in p or "logits" in p for p in comparison.problems)
    comparison.outputs = [
        replace(o, passed=o.passed and lm_ok) if o.name == ref.sig.logits else o for o in comparison.outputs
    ]
    return comparison


def _sequences(
    ref: LMRunner, feeds_list: list[dict[str, np.ndarray]] | None
) -> tuple[list[dict[str, np.ndarray]], str]:
    """The feeds the gate judges on (given, or sequences ``ref`` writes) and what they are, in words."""
    written = feeds_list is None
    if feeds_list is None:
        sequences = sample_sequences(ref.path, count=GATE_SAMPLES, length=GATE_LENGTH)
        feeds_list = [{IDS: sequences.astype(ref.sig.ids)}]
    count = sum(len(feeds[IDS]) for feeds in feeds_list)
    return feeds_list, f"{count} sequence{'s' if count != 1 else ''}" + (" the source wrote" if written else "")


def _through_cache(lm: LMRunner, ids: np.ndarray, first: int) -> np.ndarray:
    """``ids[:, :first]`` in one run, then each next token in a run of its own through the KV cache the
    previous run returned: the logits at positions ``first`` .. end, [batch, steps, vocab]."""
    _, past = lm.step(ids[:, :first])
    logits = []
    for t in range(first, ids.shape[1]):
        out, past = lm.step(ids[:, t : t + 1], past)
        logits.append(out[lm.sig.logits][:, -1:])
    return np.concatenate(logits, axis=1)


def _agreement_problems(agreement: Agreement, max_kl: float, min_top1: float, where: str) -> list[str]:
    """The bounds on mean KL and top-1 agreement: a problem for each that fails (``where``: of which logits)."""
    problems = []
    kl, top1, positions = float(agreement.kl.mean()), float(agreement.top1.mean()), agreement.kl.size
    if not np.isfinite(kl):
        problems.append(f"the logits{where} have NaN/inf values the source's don't")
    else:
        if kl > max_kl:
            problems.append(
                f"mean KL(source || variant){where} {kl:.4f} nats over {positions} positions > gate {max_kl:g}"
            )
        if top1 < min_top1:
            problems.append(f"top-1 agreement{where} {top1:.1%} over {positions} positions < gate {min_top1:.0%}")
    return problems


def _mode(config: dict[str, str] | None) -> str:
    if not config:
        return "native"
    return "native, " + ", ".join(f"{k}={v}" for k, v in sorted(config.items()))
