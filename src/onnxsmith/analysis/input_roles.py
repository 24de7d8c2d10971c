"""What each graph input of a model nobody described is: an image, a waveform and its length, token ids, ...

Read from the model only (names, dtypes, shapes, metadata and how the graph uses each input), never by
running it. Random values that ignore what an input is prove nothing: a length of 0 masks every frame of
an audio front end, and the gate then compares zeros with zeros. runtime/ makes plausible values from
these roles (runtime/plausible.py); the reports say what each input was taken to be (:meth:`InputRole.describe`).

Each rule is small and says why; the first that matches decides. Names are untrusted text: they only
steer which plausible values an input gets, and are shown quoted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import groupby

import numpy as np
import onnx_ir as ir

from onnxsmith.core.errors import UsageError
from onnxsmith.irutil.walk import constant

IMAGE, WAVEFORM, LENGTH, MASK, TOKEN_IDS, POSITIONS = "image", "waveform", "length", "mask", "token_ids", "positions"
KV_CACHE, STATE, TIMESTEP, SCALAR, GENERIC = "kv_cache", "state", "timestep", "scalar", "generic"
MEL, LATENT, CONDITION = "mel", "latent", "condition"

#: An integer scalar input with such a name is a sample rate (silero VAD's ``sr``): it gets :data:`SAMPLE_RATE`.
SAMPLE_RATE_NAME = re.compile(r"sr|sample_?rate|sampling_?rate|sample_?rate_?hz")
SAMPLE_RATE = 16000
#: ``waveforms_lens`` measures ``waveforms``; ``speech_lengths`` measures ``speech``; ``x_len`` measures ``x``.
_LENGTH_NAME = re.compile(r"(?P<stem>.*?)[_.]?(lens|lengths?|len)", re.IGNORECASE)
_WAVEFORM_NAME = re.compile(r"wave|audio|speech|signal|pcm|samples|input_values", re.IGNORECASE)
#: ``state``, ``enc_cache``, ``in_cache0`` (one of a stream's numbered states), ``h0``...
_STATE_NAME = re.compile(r"(.*[_.])?(states?|caches?)\d*([_.].*)?|h0|c0|h|c|hn|cn", re.IGNORECASE)
_KV_NAME = re.compile(r"past|present|key_?values?|kv", re.IGNORECASE)
_TIMESTEP_NAME = re.compile(r"t|timesteps?|time_?steps?|sigmas?|noise_?level|ts", re.IGNORECASE)
_TOKEN_NAME = re.compile(r".*(input_ids|token|_ids)$|ids", re.IGNORECASE)
_LATENT_NAME = re.compile(r"latent|sample|nois", re.IGNORECASE)
_IMAGE_NAME = re.compile(r"pixel|image|img|picture|frame", re.IGNORECASE)
_MEL_NAME = re.compile(r"mel|spectrogram|spec|fbank", re.IGNORECASE)
#: How many mel bands a spectrogram input has (LPCNet's 20 cepstra are not one; BigVGAN's 128 are).
_MEL_BANDS = range(40, 129)
#: Ops a value passes through unchanged in meaning (what it is, not how much), on the way to the op that tells.
_PASS_THROUGH = frozenset({"Cast", "CastLike", "Identity", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Expand"})
_COMPARISONS = frozenset({"Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
#: How far the graph-use rules look: a few ops from the input, a bounded walk up the other operand.
_HOPS = 4
_UPSTREAM = 64
#: An attention mask becomes a bias of large negatives on the way to a Softmax (BERT's ``(1 - m) * -10000``,
#: ``finfo.min``, ``masked_fill(m == 0, -inf)``, an SDPA bool mask's ``Where(m, 0, -inf)``): a constant at least
#: this large on its path; the ops it goes through on the way (elementwise, shape, comparisons; a Gather of its
#: values, as transformers' mask functions index the padding mask), for a few more hops.
_MASK_FILL = 1e4
_MASK_PATH = _PASS_THROUGH | _COMPARISONS | {"Sub", "Mul", "Add", "Div", "Neg", "Not", "Equal", "Where", "And", "Or"}
_MASK_PATH |= {"Min", "Max", "Clip", "Slice", "Tile", "Concat", "Flatten", "Gather", "GatherND", "GatherElements"}
_MASK_HOPS = 16
#: Exporters that say what their images are fed: (metadata key, value) -> (layout, range). Ultralytics'
#: preprocessing (outside the graph) feeds RGB divided by 255, NCHW.
_STATED_IMAGES = {("author", "Ultralytics"): ("NCHW", "0..1")}


@dataclass(frozen=True)
class InputRole:
    """What one input is taken to be, and the parameters its plausible values need.

    ``measures``: the input a length or mask counts along (its ``axis``); ``value_range``: an image's
    ``"0..255"``, ``"0..1"`` or ``"normalized"``; ``range_guessed``: that range is a guess (nothing in the graph,
    its metadata or the user said it: a calibration must not fix scales from it); ``ranges_alike``: where it is
    a guess, the other ranges as likely, 0..255 ruled out (int8 calibrates and verifies in each); ``vocab``: how many token ids
    a table holds; ``axis``: a kv cache's past axis; ``value``: a fixed scalar (a sample rate); ``pages``: why an
    image's pictures are pages of printed text with a photo (an output maps the picture), else ""; ``why``:
    the rule that decided.
    """

    name: str
    kind: str
    why: str = ""
    layout: str | None = None
    channels: int | None = None
    value_range: str | None = None
    measures: str | None = None
    axis: int | None = None
    vocab: int | None = None
    value: float | None = None
    range_guessed: bool = False
    ranges_alike: tuple[str, ...] = ()
    pages: str = ""

    def describe(self) -> str:
        """One line for a report: ``'waveforms_lens': length of 'waveforms' (axis 1), full length (...)``."""
        return f"'{self.name}': {self.what()}"

    def what(self) -> str:
        """What the input is taken to be, and why, without its name."""
        return self.taken_as() + (f" ({self.why})" if self.why else "")

    def taken_as(self) -> str:
        """What the input is taken to be, without why."""
        return {
            IMAGE: f"image {self.layout}, {self.channels or '?'} channel(s), values {self.value_range}"
            + (f", pages of printed text with a photo ({self.pages})" if self.pages else ""),
            WAVEFORM: f"audio waveform, a spoken sentence at speech level, {SAMPLE_RATE} Hz",
            LENGTH: f"length of '{self.measures}' (axis {self.axis}), its full length"
            if self.measures
            else "length, 8",
            MASK: f"mask of '{self.measures}', all ones (nothing padded)" if self.measures else "mask, all ones",
            TOKEN_IDS: f"token ids spread over 0..{self.vocab - 1}" if self.vocab else "token ids in 0..9",
            POSITIONS: "positions 0, 1, 2, ... (after the past length)",
            KV_CACHE: f"kv cache, past axis {self.axis} (empty at past length 0)"
            if self.axis is not None
            else "kv cache",
            STATE: "recurrent state, zeros (a stream's start)",
            MEL: f"log-mel spectrogram, {self.channels or '?'} bands, of a spoken sentence ({self.value_range}: "
            "HiFi-GAN's features)",
            TIMESTEP: "diffusion sigma, 0.03..14.6" if "sigma" in self.name.lower() else "diffusion timestep, 0..999",
            LATENT: "diffusion's noisy sample: a picture in -1..1 with the noise its timestep's level puts on it",
            CONDITION: "a per-sample condition fed 0..1, a guess: the graph does not say its range"
            if self.range_guessed
            else f"a per-sample condition, {self.value_range}",
            SCALAR: f"scalar {self.value:g}" if self.value is not None else "scalar",
            GENERIC: "random values",
        }[self.kind]


#: ``model.meta`` key: {image input: (value range, why, evidence)} where running the model told what the graph
#: does not say (runtime/image_range.py; ``{}`` once tried); :func:`input_roles` takes them for the guesses (still
#: a guess where it is not evidence).
INFERRED_RANGES = "onnxsmith.inferred_image_ranges"
#: ``model.meta`` key: {image input: why its pictures are pages of printed text} where running the model
#: showed an output that maps the picture (runtime/image_content.py; ``{}`` once tried).
PAGE_INPUTS = "onnxsmith.page_inputs"
#: ``model.meta`` key: {mel input: (log scale, why, evidence)} where a round trip through the model told
#: (runtime/spectrogram.py; ``{}`` once tried).
MEL_SCALES = "onnxsmith.mel_scales"


def input_roles(model: ir.Model) -> dict[str, InputRole]:
    """Each graph input's role (initializers listed as inputs are not inputs), in input order."""
    inputs = _inputs(model)
    lengths = {v.name: role for v in inputs if (role := _length(v, inputs)) is not None}
    measured = {role.measures for role in lengths.values()}
    roles = {}
    stated = _stated_images(model)
    for value in inputs:
        role = roles[value.name] = lengths.get(value.name) or _role(value, inputs, measured)
        if stated is not None and role.kind == IMAGE and role.range_guessed:
            layout, value_range, why = stated
            channels = role.channels if layout == role.layout else _channels(value.shape, layout)
            roles[value.name] = replace(
                role, layout=layout, channels=channels, value_range=value_range, range_guessed=False, why=why
            )
        inferred = model.meta.get(INFERRED_RANGES, {}).get(value.name)
        if inferred is not None and roles[value.name].range_guessed:
            value_range, why, evidence, alike = inferred
            roles[value.name] = replace(
                roles[value.name], value_range=value_range, range_guessed=not evidence, ranges_alike=alike, why=why
            )
        scale = model.meta.get(MEL_SCALES, {}).get(value.name)
        if scale is not None and roles[value.name].kind == MEL:
            value_range, why, evidence = scale
            roles[value.name] = replace(roles[value.name], value_range=value_range, range_guessed=not evidence, why=why)
        pages = model.meta.get(PAGE_INPUTS, {}).get(value.name)
        if pages and roles[value.name].kind == IMAGE:
            roles[value.name] = replace(roles[value.name], pages=pages)
    floats = [v.name for v in inputs if v.dtype is not None and v.dtype.is_floating_point()]
    if floats and all(roles[name].kind == STATE for name in floats):
        # A state is zeros beside the data a stream feeds; with no such data beside it, a tensor named like a
        # state ('h' of a cut graph) is the data: zeros there would exercise nothing.
        for name in floats:
            roles[name] = InputRole(name, GENERIC, "named like a state, but no other input carries data")
    return roles


def guessed_ranges(model: ir.Model, given: dict[str, dict[str, str]] | None = None) -> list[str]:
    """The image inputs whose value range is still a guess (not read from the graph, its metadata or ``given``,
    the user's corrections: :func:`parse_role_options`): made-up inputs there may be 255 times off."""
    return [r.name for r in with_given(input_roles(model), given).values() if r.kind == IMAGE and r.range_guessed]


def ranges_alike(model: ir.Model, given: dict[str, dict[str, str]] | None = None) -> dict[str, tuple[str, ...]]:
    """The image inputs whose range is a guess between ranges about as likely, 0..255 ruled out (PP-OCRv6's
    detector: normalized or 0..1), each with them, the likeliest first: pictures in every one of them cover it."""
    roles = with_given(input_roles(model), given).values()
    return {
        r.name: (r.value_range, *r.ranges_alike)
        for r in roles
        if r.kind == IMAGE and r.range_guessed and r.ranges_alike
    }


def describe_inputs(model: ir.Model, given: dict[str, dict[str, str]] | None = None) -> list[str]:
    """What each input was taken to be, one line each (for the reports of made-up and converted inputs); a run
    of inputs taken to be the same thing (a decoder's 60 cache tensors) is one line naming the first and last.
    ``given``: the user's corrections (:func:`parse_role_options`)."""
    lines: list[str] = []
    for what, grouped in groupby(with_given(input_roles(model), given).values(), key=InputRole.what):
        run = list(grouped)
        if len(run) < 3:
            lines += [role.describe() for role in run]
        else:
            lines.append(f"'{run[0].name}' ... '{run[-1].name}' ({len(run)} inputs): {what}")
    return lines


#: What ``--input-role NAME=WORD,...`` may say of an input: what it is, an image's layout, its value range, a mel
#: spectrogram's log scale (runtime/spectrogram.SCALES, "ln power" written with a hyphen).
ROLE_WORDS = {
    "kind": (IMAGE, WAVEFORM, MEL, GENERIC),
    "layout": ("NCHW", "NHWC"),
    "value_range": ("0..255", "0..1", "normalized"),
    "mel_scale": ("ln", "log10", "ln-power"),
}


def parse_role_options(items: str | list[str] | None, *, option: str = "--input-role") -> dict[str, dict[str, str]]:
    """``NAME=WORD[,WORD...]`` items (``x=NHWC,0..255``, ``audio=waveform``): input name -> {field: word}, the
    corrections of what :func:`input_roles` inferred. A comma-split list option's pieces without '=' continue
    the item before them. A layout or range makes the input an image, a log scale a mel spectrogram."""
    pieces = [p.strip() for item in ([items] if isinstance(items, str) else items or []) for p in item.split(",")]
    given: dict[str, dict[str, str]] = {}
    name = None
    for piece in filter(None, pieces):
        if "=" in piece:
            name, _, piece = piece.rpartition("=")
            name = name.strip()
        if not name:
            raise UsageError(f"{option} {piece}: expected NAME=WORD[,WORD] (e.g. x=NHWC,0..255)")
        word = piece.strip()
        field = next((f for f, words in ROLE_WORDS.items() if word in words), None)
        if field is None:
            known = ", ".join(w for words in ROLE_WORDS.values() for w in words)
            raise UsageError(f"{option} {name}={word}: '{word}' is none of {known}")
        given.setdefault(name, {})[field] = word
    return given


def with_given(roles: dict[str, InputRole], given: dict[str, dict[str, str]] | None) -> dict[str, InputRole]:
    """``roles`` with the user's corrections (:func:`parse_role_options`) applied; an unknown input name is refused."""
    if not given:
        return roles
    corrected = dict(roles)
    for name, fields in given.items():
        if name not in roles:
            raise UsageError(
                f"--input-role {name}: the model has no input '{name}' (its inputs: {', '.join(roles) or 'none'})"
            )
        role = roles[name]
        # a range alone states a condition's range (terrain_unet's `difficulty=0..1`); with a layout, an image's
        ranged = "layout" in fields or ("value_range" in fields and role.kind != CONDITION)
        kind = fields.get("kind") or (IMAGE if ranged else role.kind)
        kind = MEL if "mel_scale" in fields and not fields.get("kind") else kind
        changes: dict = {"kind": kind, "why": "given with --input-role"}
        if kind == CONDITION:
            if fields.get("value_range") not in (None, "0..1", "0..255"):
                raise UsageError(f"--input-role {name}={fields['value_range']}: a condition's range is 0..1 or 0..255")
            changes["value_range"] = fields.get("value_range") or role.value_range
            changes["range_guessed"] = changes["value_range"] is None
        elif kind == IMAGE:
            changes["layout"] = fields.get("layout") or role.layout or "NCHW"
            if changes["layout"] != role.layout:
                changes["channels"] = None  # the other axis: what it holds is the input's shape's to say
            changes["value_range"] = fields.get("value_range") or role.value_range or "normalized"
            # the user's range is known; without one, what the graph read stays known, a new image's is a guess
            changes["range_guessed"] = "value_range" not in fields and (role.kind != IMAGE or role.range_guessed)
            changes["ranges_alike"] = role.ranges_alike if changes["range_guessed"] else ()
        elif kind == MEL:  # the scale given is known; without one, what the round trip measured stays known
            scale = fields.get("mel_scale")
            changes["value_range"] = (
                scale.replace("-", " ") if scale else (role.value_range if role.kind == MEL else "ln")
            )
            changes["range_guessed"] = scale is None and (role.kind != MEL or role.range_guessed)
            changes["ranges_alike"] = ()
        else:
            changes["range_guessed"], changes["ranges_alike"] = False, ()
        corrected[name] = replace(role, **changes)
    return corrected


def unlike_real(model: ir.Model, given: dict[str, dict[str, str]] | None = None) -> list[InputRole]:
    """The float inputs whose made-up values do not look like the real thing (see :func:`plausible`): nobody
    identified them, or the range they are made in is a guess that no rule measures (a condition's, a mel
    spectrogram's scale without a vocoder's round trip). An image's guessed range is :func:`guessed_ranges`'."""
    return _unlike_real(_float_roles(model, given))


def _float_roles(model: ir.Model, given: dict[str, dict[str, str]] | None) -> list[InputRole]:
    roles = with_given(input_roles(model), given)
    return [roles[v.name] for v in _inputs(model) if v.dtype is not None and v.dtype.is_floating_point()]


def _unlike_real(floats: list[InputRole]) -> list[InputRole]:
    like_real = (IMAGE, WAVEFORM, LATENT, STATE, KV_CACHE, MASK, TIMESTEP)
    return [r for r in floats if r.kind not in like_real and not (r.kind in (MEL, CONDITION) and not r.range_guessed)]


def plausible(model: ir.Model, given: dict[str, dict[str, str]] | None = None) -> bool:
    """Whether made-up inputs look like the real thing: every float input a signal onnxsmith makes as real data
    looks (an image, a waveform, a diffusion model's noisy sample), or a state, cache, mask or timestep beside one.
    Then their ranges are a calibration's to fix scales from; random normal values for an input nobody identified
    are not, nor a condition's in a guessed range (:func:`unlike_real`). ``given``: the user's corrections
    (:func:`parse_role_options`)."""
    roles = _float_roles(model, given)  # the roles once: input_roles walks the graph
    # a mel spectrogram looks like the real thing once its log scale is known (a vocoder's round trip)
    signals = [r for r in roles if r.kind in (IMAGE, WAVEFORM, LATENT) or (r.kind == MEL and not r.range_guessed)]
    return bool(signals) and not _unlike_real(roles)


def past_dims(model: ir.Model) -> frozenset[str]:
    """The names of the input dims that may be 0 at run time: a KV cache's past axis (empty before the first
    token). A Reshape that copies such a dim cannot infer a -1 elsewhere (passes/fold_shapes.py)."""
    found = set()
    for role, value in zip(input_roles(model).values(), _inputs(model)):
        if role.kind == KV_CACHE and role.axis is not None and value.shape is not None and role.axis < len(value.shape):
            dim = value.shape[role.axis]
            if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
                found.add(dim.value)
    return frozenset(found)


def _inputs(model: ir.Model) -> list[ir.Value]:
    return [v for v in model.graph.inputs if v.name not in model.graph.initializers]


def index_bound(model: ir.Model, input_name: str) -> int | None:
    """If the input indexes a constant table (a token embedding, say), the table's length."""
    value = next((v for v in model.graph.inputs if v.name == input_name), None)
    return None if value is None else _table_rows(value)


def _role(value: ir.Value, inputs: list[ir.Value], measured: set[str | None]) -> InputRole:
    name, kind = value.name, _kind(value)
    lowered = name.lower()
    rank = None if value.shape is None else len(value.shape)
    small = rank is not None and (rank == 0 or (rank == 1 and not _fixed_above(value.shape[0], 1)))
    # silero VAD's `sr`: a model with a branch per rate; 16 kHz is what speech models take
    if kind in "iu" and SAMPLE_RATE_NAME.fullmatch(lowered) and (small or rank is None):
        return InputRole(name, SCALAR, "a sample rate by its name", value=SAMPLE_RATE)
    # an attention / padding mask: all ones keeps every position (lengths are full too)
    if "mask" in lowered and kind in "iubf":
        return InputRole(name, MASK, "by its name", measures=_sequence_partner(value, inputs))
    if kind in "iu" and "position" in lowered:
        return InputRole(name, POSITIONS, "by its name")
    # past_key_values.0.key, past_key, present...: a KV cache; its past axis is the symbolic dim named past
    if kind == "f" and _KV_NAME.search(lowered) and rank is not None and rank >= 3:
        past = next((a for a, d in enumerate(value.shape) if _dim_name(d) and "past" in _dim_name(d).lower()), None)
        return InputRole(name, KV_CACHE, "by its name", axis=past)
    # a streaming model's recurrent state (silero's `state`, an LSTM's h0/c0): a stream starts at zeros
    # (not a decoder's encoder_hidden_states: those are activations)
    if kind == "f" and _STATE_NAME.fullmatch(lowered) and "hidden" not in lowered:
        return InputRole(name, STATE, "by its name")
    # an index into a constant table: token ids over that table's rows (the vocabulary)
    rows = _table_rows(value) if kind in "iu" else None
    if rows is not None:
        return InputRole(name, TOKEN_IDS, f"indexes a table of {rows} rows", vocab=rows)
    # a mask by its use: the graph turns it into large negatives added to attention scores (ALBERT's
    # `onnx::Unsqueeze_1`). After the tables: ids whose 0 also masks padding (rxnmap's `roles`) are ids.
    if kind in "iubf" and _masks_attention(value):
        return InputRole(name, MASK, "masks attention scores", measures=_sequence_partner(value, inputs))
    if kind in "iu" and _TOKEN_NAME.fullmatch(lowered):
        return InputRole(name, TOKEN_IDS, "by its name")
    # a diffusion UNet's `timestep` / a k-diffusion model's `sigma`: one number per batch item
    if _timestep(value):
        return InputRole(name, TIMESTEP, "by its name")
    # what a diffusion model denoises (`sample`, `noisy`, `latent`) beside a timestep: noise on a picture
    if kind == "f" and rank == 4 and _LATENT_NAME.search(lowered) and any(_timestep(v) for v in inputs):
        return InputRole(name, LATENT, "by its name, beside a timestep", layout="NCHW", channels=value.shape[1])
    # a class label or a continuous condition (terrain_unet's `difficulty`): one number a Linear of one input
    # feature embeds, as the timestep's embedding is; its range is not in the graph
    if kind == "f" and small and rank is not None and _embeds_one_number(value):
        return InputRole(name, CONDITION, "a Linear of one input feature embeds it", range_guessed=True)
    image = _image(value)
    if image is not None:
        return image
    # a log-mel spectrogram [B, bands, T] named so, read by a 1-D Conv over its bands (a vocoder's first layer)
    bands = value.shape[1] if kind == "f" and rank == 3 and value.shape is not None else None
    named = isinstance(bands, int) and bands in _MEL_BANDS and _MEL_NAME.search(lowered)
    if named and _reaches(value, lambda node, index: _convolves_channels(node, index, bands)):
        why = f"by its name, and a 1-D Conv over its {bands} bands reads it"
        return InputRole(name, MEL, why, channels=bands, value_range="ln", range_guessed=True)
    # a waveform: a float [T], [B, T] or [B, C, T] (C a channel or two) named so, measured by a length, or read
    # by an STFT or a 1-D Conv over one channel; not [B, T, F] (FunASR's FSMN VAD names its 400 features per
    # frame `speech`)
    if kind == "f" and rank in (1, 2, 3) and (rank != 3 or _audio_channels(value.shape[1])):
        if name in measured:
            return InputRole(name, WAVEFORM, "a length input measures it")
        if _WAVEFORM_NAME.search(lowered):
            return InputRole(name, WAVEFORM, "by its name")
        if _reaches(value, lambda node, _index: node.op_type in ("STFT", "DFT")):
            return InputRole(name, WAVEFORM, "an STFT reads it")
        if _reaches(value, _filters_one_channel):
            return InputRole(name, WAVEFORM, "a 1-D Conv over one channel reads it: a filter bank over samples")
    return InputRole(name, GENERIC)


def _timestep(value: ir.Value) -> bool:
    """Whether ``value`` is taken for a timestep (the rule in :func:`_role`)."""
    rank = None if value.shape is None else len(value.shape)
    small = rank is not None and (rank == 0 or (rank == 1 and not _fixed_above(value.shape[0], 1)))
    return _kind(value) in "iuf" and bool(_TIMESTEP_NAME.fullmatch(value.name.lower())) and (small or rank is None)


def _embeds_one_number(value: ir.Value) -> bool:
    """A Gemm or MatMul whose constant weight has one input feature reads ``value`` (through shape ops)."""
    for node, index in _uses_through(value, _PASS_THROUGH):
        if node.op_type not in ("Gemm", "MatMul") or node.domain != "" or index != 0 or len(node.inputs) < 2:
            continue
        weight = constant(node.inputs[1])
        if weight is None or weight.ndim != 2:
            continue
        transposed = node.op_type == "Gemm" and node.attributes.get_int("transB", 0)
        if weight.shape[1 if transposed else 0] == 1:
            return True
    return False


def _audio_channels(dim) -> bool:
    """Whether ``dim`` is a waveform's channel count: fixed at 1 or 2."""
    return isinstance(dim, int) and dim in (1, 2)


def _kind(value: ir.Value) -> str:
    dtype = value.dtype
    if dtype is None:
        return "?"
    if dtype == ir.DataType.BFLOAT16:
        return "f"
    try:
        return np.dtype(dtype.numpy()).kind
    except Exception:  # a type numpy lacks (float8, int4): nothing plausible to say
        return "?"


def _dim_name(dim) -> str | None:
    return None if isinstance(dim, int) else dim.value


def _fixed_above(dim, limit: int, *, below: bool = False) -> bool:
    """Whether ``dim`` is a fixed size above ``limit`` (``below``: a fixed size at most ``limit``)."""
    if not isinstance(dim, int) or dim < 0:
        return False
    return dim <= limit if below else dim > limit


def _table_rows(value: ir.Value) -> int | None:
    """The rows of the constant table ``value`` indexes (a Gather's indices, through a Cast or a change of shape:
    the TorchScript GPT-2 flattens its ids first), else None."""
    for user, index in _uses_through(value, _PASS_THROUGH):
        if user.op_type == "Gather" and index == 1:
            table = user.inputs[0]
            axis = user.attributes.get_int("axis", 0)
            if table is not None and table.shape is not None and isinstance(table.shape[axis], int):
                return int(table.shape[axis])
    return None


def _uses_through(value: ir.Value, ops: set[str] | frozenset[str], hops: int = _HOPS):
    """(node, input index) of every use of ``value``, and of what it becomes through ``ops``, up to ``hops``."""
    frontier, seen = [value], {value}
    for _ in range(hops):
        following = []
        for v in frontier:
            for user, index in v.uses():
                yield user, index
                if user.op_type in ops:
                    for out in user.outputs:
                        if out not in seen:
                            seen.add(out)
                            following.append(out)
        frontier = following


def _reaches(value: ir.Value, reader: Callable[[ir.Node, int], bool]) -> bool:
    """Whether ``value`` feeds a node that ``reader(node, input index)`` accepts within a few ops (through any
    op: an STFT after a Pad)."""
    frontier, seen = [value], {value}
    for _ in range(_HOPS):
        following = []
        for v in frontier:
            for user, index in v.uses():
                if reader(user, index):
                    return True
                for out in user.outputs:
                    if out not in seen:
                        seen.add(out)
                        following.append(out)
        frontier = following
    return False


def _convolves_channels(node: ir.Node, index: int, channels: int) -> bool:
    """A 1-D Conv over ``channels`` input channels (weight [out, channels, k]) reading the value as its data."""
    if node.op_type != "Conv" or node.domain != "" or index != 0 or len(node.inputs) < 2:
        return False
    weight = constant(node.inputs[1])
    return weight is not None and weight.ndim == 3 and weight.shape[1] == channels


def _filters_one_channel(node: ir.Node, index: int) -> bool:
    """A 1-D Conv whose data input has one channel (weight [out, 1, k]): silero VAD's STFT as a Conv, wav2vec2's
    first layer. Reading [B, T] samples unsqueezed to [B, 1, T], it says they are a waveform."""
    if node.op_type != "Conv" or node.domain != "" or index != 0 or len(node.inputs) < 2:
        return False
    weight = constant(node.inputs[1])
    return weight is not None and weight.ndim == 3 and weight.shape[1] == 1


def _length(value: ir.Value, inputs: list[ir.Value]) -> InputRole | None:
    """A length input: what it measures, by its name (``waveforms_lens`` ↔ ``waveforms``) or by its use
    (compared with a Range over a dim of another input: the mask a length makes)."""
    if _kind(value) not in "iuf" or value.shape is None or len(value.shape) > 2:
        return None
    if len(value.shape) == 2 and not _fixed_above(value.shape[1], 1, below=True):
        return None  # [B, 1] at most: one length per batch item
    others = {v.name: v for v in inputs if v is not value and v.shape is not None and len(v.shape) >= 1}
    match = _LENGTH_NAME.fullmatch(value.name)
    if match and match.group("stem") in others:
        partner = others[match.group("stem")]
        return InputRole(value.name, LENGTH, "by its name", measures=partner.name, axis=_sequence_axis(partner))
    found = _compared_with_range(value, others)
    if found is not None:
        partner, axis = found
        return InputRole(value.name, LENGTH, "compared with a Range over its dim", measures=partner.name, axis=axis)
    if match and _kind(value) in "iu":
        partner = _only_sequence(value, inputs)
        if partner is not None:
            return InputRole(value.name, LENGTH, "by its name", measures=partner.name, axis=_sequence_axis(partner))
        return InputRole(value.name, LENGTH, "by its name")
    return None


def _compared_with_range(value: ir.Value, others: dict[str, ir.Value]) -> tuple[ir.Value, int] | None:
    """(input, axis) when ``value`` (through Unsqueeze, Cast, a Div by a hop length...) is compared with a
    Range whose limit is read from that input's shape: ``Range(0, Shape(x)[axis]) < lens`` masks x's padding."""
    through = _PASS_THROUGH | {"Div", "Mul", "Add", "Sub"}
    for user, index in _uses_through(value, through):
        if user.op_type not in _COMPARISONS or len(user.inputs) != 2:
            continue
        other = user.inputs[1 - index]
        nodes = _upstream_nodes(other)
        if not any(n.op_type == "Range" for n in nodes):
            continue
        for shape in (n for n in nodes if n.op_type == "Shape"):
            source = shape.inputs[0]
            if source is not None and source.name in others and others[source.name] is source:
                start = shape.attributes.get_int("start", 0)
                rank = len(source.shape) if source.shape is not None else 0
                start = start + rank if start < 0 else start
                return source, start if 0 < start < rank else _sequence_axis(source)
            reached = [v for v in _upstream_inputs(source) if v.name in others and others[v.name] is v]
            if len(reached) == 1:  # the frames of an STFT of the waveform: the waveform's samples
                return reached[0], _sequence_axis(reached[0])
    return None


def _upstream_nodes(value: ir.Value | None) -> list[ir.Node]:
    """The nodes ``value`` is computed from, nearest first, at most :data:`_UPSTREAM` of them."""
    nodes: list[ir.Node] = []
    pending, seen = [value], set()
    while pending and len(nodes) < _UPSTREAM:
        v = pending.pop(0)
        node = None if v is None else v.producer()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        pending.extend(node.inputs)
    return nodes


def _upstream_inputs(value: ir.Value | None) -> list[ir.Value]:
    """The graph inputs ``value`` is computed from (a bounded walk)."""
    if value is not None and value.is_graph_input():
        return [value]
    found = []
    for node in _upstream_nodes(value):
        found.extend(v for v in node.inputs if v is not None and v.is_graph_input() and v not in found)
    return found


def _sequence_axis(value: ir.Value) -> int:
    """The axis a length counts along: the last symbolic axis past the batch (a waveform's samples, the
    frames of [B, 80, T] features), else the last axis."""
    shape = value.shape
    assert shape is not None
    rank = len(shape)
    free = [a for a, d in enumerate(shape) if not isinstance(d, int) or d < 0]
    free = [a for a in free if a > 0 or rank == 1]
    return free[-1] if free else rank - 1


def _only_sequence(value: ir.Value, inputs: list[ir.Value]) -> ir.Value | None:
    """The one other input with a sequence (a float or int input of rank >= 2), when there is just one."""
    candidates = [v for v in inputs if v is not value and v.shape is not None and len(v.shape) >= 2]
    return candidates[0] if len(candidates) == 1 else None


def _sequence_partner(value: ir.Value, inputs: list[ir.Value]) -> str | None:
    """What a mask counts positions of: the token ids (``input_ids``) or the input it has the shape of (of
    several, the one indexing the largest table: the token ids, not their token types)."""
    for v in inputs:
        if v is not value and v.name.lower().endswith("input_ids"):
            return v.name
    if value.shape is None:
        return None
    same = [v for v in inputs if v is not value and v.shape is not None and list(v.shape) == list(value.shape)]
    if not same:
        return None
    return max(same, key=lambda v: (_table_rows(v) or 0) if _kind(v) in "iu" else 0).name


def _masks_attention(value: ir.Value) -> bool:
    """Whether ``value`` becomes a bias of large negatives (a constant of at least :data:`_MASK_FILL` on its
    way) that reaches a Softmax through elementwise and shape ops only: what an attention mask becomes in
    both torch exporters' graphs. Token ids (a Gather first) and images (a Conv) never get there."""
    frontier, seen = [(value, False)], {value}
    for _ in range(_MASK_HOPS):
        following = []
        for v, filled in frontier:
            for user, index in v.uses():
                if user.op_type == "Softmax" and filled:
                    return True
                if user.op_type not in _MASK_PATH or user.domain not in ("", "ai.onnx"):
                    continue
                if user.op_type.startswith("Gather") and index != 0:
                    continue  # indices (token ids) pick rows; only the gathered data is still the mask
                others = (constant(x) for i, x in enumerate(user.inputs) if i != index and x is not None)
                large = any(c is not None and c.size and c.dtype.kind == "f" and _large(c) for c in others)
                for out in user.outputs:
                    if out not in seen:
                        seen.add(out)
                        following.append((out, filled or large))
        frontier = following
    return False


def _large(array: np.ndarray) -> bool:
    return bool((np.abs(array.astype(np.float64)) >= _MASK_FILL).any())  # -inf and finfo.min too


def _image(value: ir.Value) -> InputRole | None:
    """A 4-D float or uint8 input with 1-4 channels first (NCHW) or last (NHWC), or named so; its value
    range from the first ops that read it (see :func:`_value_range`)."""
    kind = _kind(value)
    shape = value.shape
    if shape is None or len(shape) != 4 or kind not in "fu":
        return None
    if _LATENT_NAME.search(value.name):
        return None  # a diffusion model's noisy latent (`sample`, 4 channels): noise, not a picture
    channels_first, channels_last = shape[1], shape[3]
    if isinstance(channels_first, int) and 1 <= channels_first <= 4:
        layout, channels = "NCHW", channels_first
    elif isinstance(channels_last, int) and 1 <= channels_last <= 4:
        layout, channels = "NHWC", channels_last
    elif _IMAGE_NAME.search(value.name):
        layout, channels = "NCHW", channels_first if isinstance(channels_first, int) else None
    else:
        return None
    if kind == "u":
        return InputRole(value.name, IMAGE, "uint8 pixels", layout=layout, channels=channels, value_range="0..255")
    read = _value_range(value)
    if read is None:  # nothing in the graph says: the most common convention, a guess
        why = "read as it comes: normalized outside the model"
        return InputRole(
            value.name, IMAGE, why, layout=layout, channels=channels, value_range="normalized", range_guessed=True
        )
    return InputRole(value.name, IMAGE, read[1], layout=layout, channels=channels, value_range=read[0])


def _channels(shape: ir.Shape | None, layout: str) -> int | None:
    """The channels of an image of ``shape`` in ``layout``, where the shape fixes them."""
    dim = None if shape is None or len(shape) != 4 else shape[1 if layout == "NCHW" else 3]
    return dim if isinstance(dim, int) and dim > 0 else None


def _stated_images(model: ir.Model) -> tuple[str, str, str] | None:
    """(layout, range, why) of the images of a model whose exporter says what they are fed (its metadata)."""
    props = model.metadata_props
    for (key, word), (layout, value_range) in _STATED_IMAGES.items():
        if props.get(key) == word:
            return layout, value_range, f"the model's metadata: {key} {word!r} feeds {layout} {value_range}"
    return None


def _value_range(value: ir.Value) -> tuple[str, str] | None:
    """An image's value range from the first arithmetic the graph does on it.

    A Div by ~255 or a Mul by ~1/255 scales raw 0..255 pixels; a Sub of a mean subtracts it from pixels in
    the mean's range (ImageNet's 0.485 from 0..1, 123.7 from 0..255); a Mul by 2 before a Sub of 1 maps
    0..1 to -1..1. Read first by a Conv (or anything else): None, nothing says (it takes it as it comes).
    """
    current = value
    for _ in range(_HOPS + 2):
        uses = list(current.uses())
        if len(uses) != 1:
            break
        node, index = uses[0]
        operand = node.inputs[1 - index] if len(node.inputs) == 2 else None
        factor = constant(operand) if operand is not None else None
        if node.op_type in _PASS_THROUGH:
            current = node.outputs[0]
            continue
        if factor is None or factor.size == 0 or factor.dtype.kind not in "fiu":
            break
        magnitude = float(np.max(np.abs(factor)))
        if node.op_type == "Div" and index == 0:
            if magnitude >= 100:
                return "0..255", "the graph divides it by 255"
            current = node.outputs[0]  # a Div by a std: the Sub before it (or after) decides
            continue
        if node.op_type == "Mul":
            if 0 < magnitude <= 0.02:
                return "0..255", "the graph multiplies it by 1/255"
            current = node.outputs[0]  # 2x - 1: the Sub after it decides
            continue
        if node.op_type in ("Sub", "Add") and index == 0:
            if magnitude > 1.5:
                return "0..255", "the graph subtracts a mean in 0..255"
            return "0..1", "the graph subtracts a mean in 0..1"
        break
    return None
