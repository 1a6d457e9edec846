"""CTranslate2 model directories (``model.bin``, ``config.json``, vocabularies) and Argos
Translate packages, which carry one (LibreTranslate installs these).

``model.bin`` is read directly (its layout is CTranslate2's ``ModelSpec._serialize``: a
version, the spec's name and revision, named arrays, then aliases), so importing needs no
CTranslate2 installation; every binary version and spec revision CTranslate2 still loads is
read as it reads them (``read_model_bin``, ``_modernised``, ``legacy_config``). Float16,
bfloat16, int8 and int16 weights are turned back into float32 (int8 and int16 with their
``weight_scale``; older int16 files with CTranslate2's global scale). The source conventions
(BOS, EOS) are CTranslate2's ``add_source_bos``/``add_source_eos`` and go into the bundle.
What the model computes follows CTranslate2's ``TransformerEncoder``/``TransformerDecoder``
(``src/layers/transformer.cc``): flags it leaves out take CTranslate2's defaults (pre-norm,
ReLU, scaled embeddings, its built-in sinusoids); relative position representations (Shaw et
al.) are imported, and anything else it supports that this model does not (relative
attention biases, ALiBi, RMS norm, gated feed-forward, several source features, ...) is
refused. One difference by design: our decoder never emits padding or its start token, which
CTranslate2 would on a model that predicts them (trained models do not).
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.config import ModelConfig
from training.importers import Imported, UnsupportedModel, language_tokens
from training.model import Transformer, sinusoidal_table
from training.weights import ctranslate2_layout, unpack

# common_spec.Activation: RELU, GELUTanh, SWISH, GELU, GELUSigmoid, Tanh, Sigmoid
ACTIVATIONS = {0: "relu", 2: "swish", 3: "gelu"}
_DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16, "bfloat16")
PAD_PIECES = ("<blank>", "<pad>")
# Variables whose presence means a feature this model lacks, with its name.
_UNSUPPORTED = {
    "relative_asymmetric_position_keys": "asymmetric relative position representations",
    "relative_attention_bias": "relative attention bias",
    "rotary_dim": "rotary position embeddings",
    "linear_0_noact": "a gated feed-forward layer",
    "layernorm_embedding": "a layer norm on the embeddings",
    "embeddings_1": "several source features",
    "alibi": "ALiBi position biases",
    "multi_query_attention": "multi-query attention",
    "num_heads_kv": "grouped-query attention",
    "rms_norm": "RMS norm",
    "project_in": "embedding projections",
    "queries_scale": "a non-standard attention scale",
}


# Heads of a model whose spec predates the stored head count (revision < 3), by spec name.
LEGACY_HEADS = {"": 8, "TransformerBase": 8, "TransformerBig": 16}
# Before config.json (binary version 6), model.bin held these attributes, with these defaults.
LEGACY_ATTRIBUTES = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
                     "with_source_bos": False, "with_source_eos": False,
                     "with_target_bos": True, "user_decoder_start_tokens": False}
# Item widths of binary versions before 4, which stored no type id.
_ITEM_TYPES = {4: np.float32, 2: np.int16, 1: np.int8}
# int16 weights stored without a scale (older releases) were quantised with this one.
GLOBAL_INT16_SCALE = 1000.0


@dataclass
class ModelBin:
    """A CTranslate2 ``model.bin``, as any binary version since the first stores it."""

    version: int
    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]
    bfloat16: frozenset[str] = frozenset()  # read into float32: what was stored in bfloat16


def read_model_bin(path: Path) -> ModelBin:
    """A CTranslate2 ``model.bin`` of binary version 1 to 6, read as CTranslate2's
    ``models::Model::load`` reads it: version 2 added the spec's name and revision, 3 the
    aliases, 4 a type id and byte count per variable in place of an item width and count."""
    data = path.read_bytes()
    offset = 0

    def take(fmt: str) -> Any:
        nonlocal offset
        value = struct.unpack_from("<" + fmt, data, offset)[0]
        offset += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal offset
        length = take("H")
        value = data[offset : offset + length - 1].decode("utf-8")
        offset += length
        return value

    version = take("I")
    if not 1 <= version <= 6:
        raise UnsupportedModel(f"{path}: CTranslate2 binary version {version}, which this "
                               "importer does not know (1 to 6)")
    spec, revision = (string(), take("I")) if version >= 2 else ("", 1)
    variables: dict[str, np.ndarray] = {}
    bfloat16 = set()
    for _ in range(take("I")):
        name = string()
        shape = [take("I") for _ in range(take("B"))]
        if version >= 4:
            dtype = _DTYPES[take("B")]
            size = take("I")
        else:
            width = take("B")
            if width not in _ITEM_TYPES:
                raise UnsupportedModel(f"{path}: {name} has items of {width} bytes")
            dtype, size = _ITEM_TYPES[width], take("I") * width
        raw = data[offset : offset + size]
        offset += size
        if dtype == "bfloat16":
            array = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            bfloat16.add(name)
        else:
            array = np.frombuffer(raw, dtype)
        variables[name] = array.reshape(shape)
    aliases = {string(): string() for _ in range(take("I"))} if version >= 3 else {}
    return ModelBin(version, spec, revision, variables, aliases, frozenset(bfloat16))


def _v1_name(name: str) -> str:
    """A revision-1 variable's name (OpenNMT-tf's) as later revisions spell it, the renaming
    CTranslate2 applies when it loads such a model (``map_v1_variable_name``)."""
    for old, new in (("transformer/", ""), (":0", ""), ("w_embs", "embeddings/weight"),
                     ("kernel", "weight"), ("LayerNorm", "layer_norm"), ("dense", "projection"),
                     ("conv1d_", "linear_"), ("conv1d", "linear_0")):
        name = name.replace(old, new, 1)
    if "encoder" in name:
        return name.replace("multi_head", "self_attention", 1)
    return name.replace("masked_multi_head", "self_attention", 1).replace(
        "multi_head", "attention", 1)


def _modernised(model: ModelBin) -> ModelBin:
    """An older revision's variables under the names and scopes of the current one: the
    renaming of revision 1, the head count of revisions before 3 (from the spec's name), the
    stack-wide flags of revisions before 5 (one value for both stacks), the single source
    embedding's older scope and the older name of the embedding scale."""
    variables, aliases = dict(model.variables), dict(model.aliases)
    if model.revision == 1:
        variables = {_v1_name(name): value for name, value in variables.items()}
    if model.revision < 3 and "num_heads" not in variables:
        variables["num_heads"] = np.array(LEGACY_HEADS.get(model.spec, 8), np.int8)
    if model.revision < 5:
        for flag in ("num_heads", "pre_norm", "activation", "embeddings_merge"):
            if flag in variables:
                for scope in ("encoder", "decoder"):
                    aliases.setdefault(f"{scope}/{flag}", flag)
    for name in list(variables) + list(aliases):
        if name.startswith("encoder/embeddings/"):
            aliases.setdefault(name.replace("/embeddings/", "/embeddings_0/", 1), name)
        if name.endswith("/embeddings/multiply_by_sqrt_depth"):
            scope = name.split("/", 1)[0]
            aliases.setdefault(f"{scope}/scale_embeddings", name)
    return dataclasses.replace(model, variables=variables, aliases=aliases)


def legacy_config(model: ModelBin) -> dict[str, Any]:
    """config.json's entries of a model from before config.json (binary version < 6), from
    the attributes model.bin held, as CTranslate2's ``SequenceToSequenceModel::initialize``
    derives them."""
    found: dict[str, Any] = {}
    for name, default in LEGACY_ATTRIBUTES.items():
        value = model.variables.get(name)
        if value is None:
            found[name] = default
        elif isinstance(default, str):
            found[name] = value.astype(np.int8).tobytes().decode("utf-8")
        else:
            found[name] = bool(value.item())
    if found["user_decoder_start_tokens"]:
        start = None
    else:
        start = found["bos_token"] if found["with_target_bos"] else found["eos_token"]
    return {"unk_token": found["unk_token"], "bos_token": found["bos_token"],
            "eos_token": found["eos_token"], "add_source_bos": found["with_source_bos"],
            "add_source_eos": found["with_source_eos"], "decoder_start_token": start}


class _Variables:
    """model.bin's arrays by name, aliases resolved and weights dequantised to float32."""

    def __init__(self, path: Path):
        self.path = path
        stored = read_model_bin(path)
        if stored.spec not in ("TransformerSpec", *LEGACY_HEADS):
            raise UnsupportedModel(f"{path}: a {stored.spec}, not a Transformer "
                                   "encoder-decoder (TransformerSpec)")
        self.model = _modernised(stored)
        self.raw, self.aliases = self.model.variables, self.model.aliases
        names = set(self.raw) | set(self.aliases)
        for name in names:
            for marker, feature in _UNSUPPORTED.items():
                if f"/{marker}" in name and self._enabled(name):
                    raise UnsupportedModel(f"{path}: uses {feature} ({name}), which this "
                                           "model does not support")

    def _enabled(self, name: str) -> bool:
        value = self.raw.get(self.aliases.get(name, name))
        return value is None or value.ndim > 0 or bool(value)

    def has(self, name: str) -> bool:
        return name in self.raw or name in self.aliases

    def scalar(self, name: str, default: Any) -> Any:
        if not self.has(name):
            return default
        return self.raw[self.aliases.get(name, name)].item()

    def array(self, name: str) -> np.ndarray:
        if not self.has(name):
            raise UnsupportedModel(f"{self.path}: no {name}: a layout this model does not "
                                   "support")
        stored = self.aliases.get(name, name)
        value = self.raw[stored]
        if value.dtype in (np.int8, np.int16):  # quantised: weight / scale (per row for int8)
            scale_name = self.aliases.get(stored + "_scale", stored + "_scale")
            if scale_name in self.raw:
                scale = self.raw[scale_name]
            elif value.dtype == np.int16:  # an older release's int16 weights
                scale = np.array(GLOBAL_INT16_SCALE, np.float32)
            else:
                raise UnsupportedModel(f"{self.path}: int8 {name} without its scale")
            scale = scale.reshape(-1, 1) if scale.ndim else scale
            return value.astype(np.float32) / scale
        return value.astype(np.float32)

    def same(self, a: str, b: str) -> bool:
        """Whether two variables are one (an alias) or hold equal values."""
        if self.aliases.get(a, a) == self.aliases.get(b, b):
            return True
        return np.array_equal(self.array(a), self.array(b))


def _read_vocabulary(directory: Path, name: str) -> list[str] | None:
    if (directory / f"{name}.json").is_file():
        return json.loads((directory / f"{name}.json").read_text(encoding="utf-8"))
    if (directory / f"{name}.txt").is_file():
        return (directory / f"{name}.txt").read_text(encoding="utf-8").splitlines()
    return None


def _position_layout(variables: _Variables, scope: str, d_model: int) -> tuple[str, int]:
    """The (layout, offset) whose sinusoids equal the model's position table; CTranslate2's
    own when the model stores none."""
    name = f"{scope}/position_encodings/encodings"
    if not variables.has(name):
        return "tensor2tensor", 1
    table = torch.from_numpy(variables.array(name))
    # A table stored in 16 bits is the sinusoids rounded: compare at that precision.
    stored_name = variables.aliases.get(name, name)
    stored = variables.raw[stored_name].dtype
    tolerance = {np.dtype(np.float32): 1e-4, np.dtype(np.float16): 1e-3}.get(stored, 1e-2)
    if stored_name in variables.model.bfloat16:
        tolerance = 1e-2
    for layout in ("halves", "interleaved", "tensor2tensor"):
        for offset in (0, 1, 2):
            candidate = sinusoidal_table(table.shape[0], d_model, layout, offset)
            if torch.allclose(candidate, table, atol=tolerance):
                return layout, offset
    raise UnsupportedModel(f"{variables.path}: learned or unusual position encodings "
                           f"({name}), which this model does not support")


def _layers(variables: _Variables, scope: str) -> int:
    count = 0
    while variables.has(f"{scope}/layer_{count}/ffn/linear_0/weight"):
        count += 1
    return count


def _weights(variables: _Variables, layers: ModelConfig) -> dict[str, np.ndarray]:
    """The layers' parameters, where ``training.weights.ctranslate2_layout`` declares them
    (``layers`` gives the stacks' depth, norm placement and relative positions)."""
    ours: dict[str, np.ndarray] = {}
    for stored in ctranslate2_layout(layers):
        ours.update(unpack(stored, variables.array(stored.name), layers))
    return ours


def _relative_positions(variables: _Variables) -> int:
    """The clipping distance of the self-attentions' relative position representations (0:
    none); every self-attention must have them, alike."""
    found = set()
    for scope in ("encoder", "decoder"):
        for i in range(_layers(variables, scope)):
            attention = f"{scope}/layer_{i}/self_attention"
            if not variables.has(attention + "/relative_position_keys"):
                found.add(0)
                continue
            keys = variables.array(attention + "/relative_position_keys")
            values = variables.array(attention + "/relative_position_values")
            if keys.shape != values.shape or keys.shape[0] % 2 == 0:
                raise UnsupportedModel(f"{variables.path}: relative position tables of shapes "
                                       f"{keys.shape} and {values.shape} in {attention}")
            found.add((keys.shape[0] - 1) // 2)
    if len(found) > 1:
        raise UnsupportedModel(f"{variables.path}: relative positions in some self-attentions "
                               "only, or clipped at different distances")
    return found.pop() if found else 0


def _scale(variables: _Variables, scope: str, d_model: int) -> bool:
    """Whether embeddings are multiplied by sqrt(d_model) (CTranslate2 stores a flag or the
    factor itself; other factors are refused)."""
    name = f"{scope}/scale_embeddings"
    if not variables.has(name):
        return True
    value = float(variables.scalar(name, 1))
    if variables.raw[variables.aliases.get(name, name)].dtype == np.int8:
        return bool(value)
    if math.isclose(value, 1.0):
        return False
    if math.isclose(value, math.sqrt(d_model), rel_tol=1e-5):
        return True
    raise UnsupportedModel(f"{variables.path}: embeddings scaled by {value}, which this model "
                           "does not support (only 1 or sqrt(d_model))")


def _tokenizers(directory: Path, package: Path | None) -> tuple[Path, Path | None]:
    """The SentencePiece model(s) beside the model (or at an Argos package's root)."""
    for root in (directory, package):
        if root is None:
            continue
        if (root / "source.spm").is_file() and (root / "target.spm").is_file():
            return root / "source.spm", root / "target.spm"
        found = sorted([*root.glob("*.model"), *root.glob("*.spm")])
        if len(found) == 1:
            return found[0], None
    raise UnsupportedModel(f"{directory}: no SentencePiece model found; put it beside "
                           "model.bin (sentencepiece.model, or source.spm and target.spm)")


def recognise(path: Path) -> bool:
    return (path / "model.bin").is_file() or recognise_argos(path)


def recognise_argos(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".argosmodel" or zipfile.is_zipfile(path)
    return (path / "metadata.json").is_file() and (path / "model" / "model.bin").is_file()


def read(path: Path, package: Path | None = None, languages: tuple[str, str] | None = None,
         ) -> Imported:
    """Read a CTranslate2 model directory (``package``: the Argos package holding it)."""
    config: dict[str, Any] = {}
    if (path / "config.json").is_file():
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    variables = _Variables(path / "model.bin")
    if variables.model.version < 6:  # its conventions are in model.bin, as CTranslate2 reads
        config.update(legacy_config(variables.model))
    shared = _read_vocabulary(path, "shared_vocabulary")
    source_pieces = shared or _read_vocabulary(path, "source_vocabulary")
    target_pieces = shared or _read_vocabulary(path, "target_vocabulary")
    if source_pieces is None or target_pieces is None:
        raise UnsupportedModel(f"{path}: no vocabulary (shared_vocabulary.json, or "
                               "source_vocabulary.json and target_vocabulary.json)")
    source_pieces, target_pieces = list(source_pieces), list(target_pieces)
    # CTranslate2 appends the unknown token after the last entry of a vocabulary that lacks
    # it (its ``Vocabulary``); the models that rely on this (binary versions 1-2, as early
    # Argos packages ship) have that extra row in their embedding tables.
    unk = config.get("unk_token", "<unk>")
    for pieces in (source_pieces, target_pieces):
        if unk not in pieces:
            pieces.append(unk)
    if variables.has("encoder/layer_0/self_attention/linear_2/weight"):
        raise UnsupportedModel(f"{path}: unfused attention projections")

    heads = int(variables.scalar("encoder/num_heads", 8))
    if int(variables.scalar("decoder/num_heads", 8)) != heads:
        raise UnsupportedModel(f"{path}: different encoder and decoder head counts")
    pre_norm = bool(variables.scalar("encoder/pre_norm", 1))
    if bool(variables.scalar("decoder/pre_norm", 1)) != pre_norm:
        raise UnsupportedModel(f"{path}: a pre-norm encoder with a post-norm decoder")
    activation = int(variables.scalar("encoder/activation", 0))
    if activation not in ACTIVATIONS or activation != int(variables.scalar("decoder/activation",
                                                                           0)):
        raise UnsupportedModel(f"{path}: the activation {activation} (CTranslate2's "
                               "common_spec.Activation), which this model does not support")
    source_embed = variables.array("encoder/embeddings_0/weight")
    target_embed = variables.array("decoder/embeddings/weight")
    d_model, d_ff = target_embed.shape[1], variables.array(
        "encoder/layer_0/ffn/linear_0/weight").shape[0]
    layout, offset = _position_layout(variables, "decoder", d_model)
    if (layout, offset) != _position_layout(variables, "encoder", d_model):
        raise UnsupportedModel(f"{path}: different encoder and decoder position encodings")
    scale = _scale(variables, "decoder", d_model)
    if scale != _scale(variables, "encoder", d_model):
        raise UnsupportedModel(f"{path}: embeddings scaled in one stack only")
    share_embeddings = (shared is not None and variables.same("encoder/embeddings_0/weight",
                                                              "decoder/embeddings/weight"))
    tie = variables.same("decoder/projection/weight", "decoder/embeddings/weight")
    max_relative = _relative_positions(variables)
    weights = _weights(variables, ModelConfig(
        encoder_layers=_layers(variables, "encoder"), decoder_layers=_layers(variables, "decoder"),
        pre_norm=pre_norm, max_relative_positions=max_relative))
    projection = variables.array("decoder/projection/weight")
    bias = (variables.array("decoder/projection/bias")
            if variables.has("decoder/projection/bias") else np.zeros(len(target_pieces),
                                                                       np.float32))

    def index(pieces: list[str], token: str | None, what: str) -> int:
        if token is None or token not in pieces:
            raise UnsupportedModel(f"{path}: the {what} token {token!r} is not in the "
                                   "vocabulary")
        return pieces.index(token)

    # Padding is ours alone (CTranslate2 needs none): a zero row where the vocabulary has no
    # pad piece. A decoder that starts from a zero embedding starts from such a row.
    pad_piece = next((p for p in PAD_PIECES if p in source_pieces and p in target_pieces), None)
    zero_start = bool(variables.scalar("decoder/start_from_zero_embedding", 0))
    pad_row_zero = pad_piece is not None and not target_embed[
        target_pieces.index(pad_piece)].any()
    if pad_piece is None or (zero_start and not pad_row_zero):
        pad_piece = "<pad>" if "<pad>" not in target_pieces else "<start>"
        zero = np.zeros((1, d_model), np.float32)
        source_embed = np.concatenate([source_embed, zero])
        target_embed = np.concatenate([target_embed, zero])
        projection = np.concatenate([projection, zero])
        bias = np.concatenate([bias, np.zeros(1, np.float32)])
        source_pieces = [*source_pieces, pad_piece]
        target_pieces = source_pieces if shared is not None else [*target_pieces, pad_piece]
    pad_id = index(source_pieces, pad_piece, "padding")
    if index(target_pieces, pad_piece, "padding") != pad_id:
        raise UnsupportedModel(f"{path}: the padding token has different ids in the source "
                               "and target vocabularies")
    eos = config.get("eos_token", "</s>")
    start = config.get("decoder_start_token", config.get("bos_token", "<s>"))
    bos_id = pad_id if zero_start else index(target_pieces, start, "decoder start")
    weights["embeddings.lut.weight"] = target_embed
    if not share_embeddings:
        weights["source_embeddings.lut.weight"] = source_embed
    if not tie:
        weights["output_projection.weight"] = projection
    weights["output_bias"] = bias
    model_config = ModelConfig(
        d_model=d_model, d_ff=d_ff, heads=heads, encoder_layers=_layers(variables, "encoder"),
        decoder_layers=_layers(variables, "decoder"), dropout=0.0,
        vocab_size=len(target_pieces),
        source_vocab_size=0 if share_embeddings else len(source_pieces),
        max_positions=(variables.array("decoder/position_encodings/encodings").shape[0]
                       if variables.has("decoder/position_encodings/encodings") else 512),
        pre_norm=pre_norm,
        layer_norm_eps=float(config.get("layer_norm_epsilon") or 1e-5),
        activation=ACTIVATIONS[activation], position_layout=layout, position_offset=offset,
        scale_embeddings=scale, shared_embeddings=share_embeddings, tie_output=tie,
        max_relative_positions=max_relative,
        output_bias=True, pad_id=pad_id,
        unk_id=index(source_pieces, config.get("unk_token", "<unk>"), "unknown"),
        bos_id=bos_id, eos_id=index(target_pieces, eos, "end"),
    )
    if index(source_pieces, eos, "end") != model_config.eos_id:
        raise UnsupportedModel(f"{path}: the end token has different ids in the source and "
                               "target vocabularies")
    model = Transformer(model_config)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                           for k, v in weights.items()}, strict=True)
    # What CTranslate2 adds to the pieces it is given (config.json; both false when absent, as
    # OpenNMT-py writes them, and so Argos Translate ships them). A Marian model (it starts
    # from a zero embedding) also reads an EOS: CTranslate2 adds it to a model converted from
    # Marian's own files, Marian's tokenizer to one converted through Transformers.
    add_bos = bool(config.get("add_source_bos", False))
    source_format = {"add_bos": add_bos,
                     "add_eos": bool(config.get("add_source_eos", False)) or zero_start}
    source_bos_id = (index(source_pieces, config.get("bos_token", "<s>"), "source start")
                     if add_bos else None)
    source_model, target_model = _tokenizers(path, package)
    source_lang, target_lang = languages or (None, None)
    return Imported(
        model=model.eval(), source_tokenizer=source_model, target_tokenizer=target_model,
        vocabulary={"source": source_pieces, "target": target_pieces},
        source_lang=source_lang, target_lang=target_lang,
        target_languages=language_tokens(source_pieces),
        origin={"format": "argos" if package else "ctranslate2",
                "path": str(package or path)},
        source_format=source_format, source_bos_id=source_bos_id,
    )


def read_argos(path: Path) -> Imported:
    """An Argos Translate package: a ``.argosmodel`` zip or its unpacked folder."""
    if path.is_file():
        with zipfile.ZipFile(path) as archive, tempfile.TemporaryDirectory() as tmp:
            archive.extractall(tmp)
            roots = [p for p in Path(tmp).iterdir() if p.is_dir()]
            root = roots[0] if len(roots) == 1 and not (Path(tmp) / "metadata.json").is_file() \
                else Path(tmp)
            imported = read_argos(root)
            # The tokenizer files live in the temporary folder: keep copies that outlive it.
            keep = Path(tempfile.mkdtemp(prefix="argos-"))
            imported.source_tokenizer = _copy(imported.source_tokenizer, keep)
            if imported.target_tokenizer:
                imported.target_tokenizer = _copy(imported.target_tokenizer, keep)
            imported.origin["path"] = str(path)
            return imported
    metadata = argos_metadata(path)
    languages = (metadata.get("from_code"), metadata.get("to_code"))
    imported = read(path / "model", package=path,
                    languages=languages if all(languages) else None)
    imported.origin["package_version"] = metadata.get("package_version")
    imported.origin["argos_version"] = metadata.get("argos_version")
    if (path / "stanza").is_dir():
        # Argos splits sentences with this Stanza model; the service segments text itself.
        imported.origin["not_imported"] = ["stanza (sentence splitting)"]
    return imported


def argos_metadata(path: Path) -> dict[str, Any]:
    """An unpacked Argos package's ``metadata.json``, refused by name where the package is
    not a translation model this importer reads: another package type, or a tokenizer other
    than SentencePiece (Argos Translate 1.9's ``bpe.model``: Moses tokenisation and
    subword-nmt BPE, which the service does not apply)."""
    if not (path / "metadata.json").is_file():
        raise UnsupportedModel(f"{path}: an Argos package without metadata.json")
    metadata = json.loads((path / "metadata.json").read_text(encoding="utf-8"))
    kind = metadata.get("type", "translate")
    if kind != "translate":
        raise UnsupportedModel(f"{path}: an Argos {kind!r} package, not a translation model")
    if (path / "bpe.model").is_file() and not (path / "sentencepiece.model").is_file():
        raise UnsupportedModel(
            f"{path}: tokenized with BPE (bpe.model: Moses tokenisation and subword-nmt), "
            "which the service does not apply; only SentencePiece packages import")
    return metadata


def _copy(file: Path, directory: Path) -> Path:
    target = directory / file.name
    target.write_bytes(file.read_bytes())
    return target
