"""Configuration as plain dataclasses, loaded from one TOML file with command-line overrides.

A config file has the sections ``[data]``, ``[vocab]``, ``[model]`` and ``[train]``; every field
below can be set there or overridden on the command line as ``--set train.max_steps=100``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Special token ids are fixed so that every bundle and every piece of code agrees on them.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

ACTIVATIONS = ("relu", "gelu", "swish")
POSITION_LAYOUTS = ("interleaved", "halves", "tensor2tensor")


@dataclass
class SourceFile:
    """One parallel-text source: a TSV file (``src<TAB>tgt``) or a Moses prefix (``x`` for
    ``x.en`` + ``x.de``); plain, ``.gz`` or ``.xz``. ``weight`` up- or down-samples it in
    train; ``heldout_share`` is its share of dev and test relative to the other sources (2.0:
    twice as many pairs as a source at 1.0; 0: none)."""

    path: str
    weight: float = 1.0
    heldout_share: float = 1.0


@dataclass
class FilterConfig:
    min_tokens: int = 1  # whitespace tokens, per side
    max_tokens: int = 120
    max_ratio: float = 3.0  # longer side / shorter side, in characters (+1 smoothing)
    # A stricter ratio for train only (0: max_ratio), applied after the split, so that dev and
    # test, drawn under max_ratio, stay the same sentences when it changes.
    train_max_ratio: float = 0.0
    drop_source_equals_target: bool = True
    dedupe: bool = True  # exact and normalised (case, punctuation, digits folded) duplicates


@dataclass
class DataConfig:
    sources: list[SourceFile] = field(default_factory=list)
    source_lang: str = "en"
    target_lang: str = "de"
    filters: FilterConfig = field(default_factory=FilterConfig)
    dev_size: int = 2000
    test_size: int = 2000
    seed: int = 1234
    out_dir: str = "runs/data"  # train.tsv, dev.tsv, test.tsv, report.json
    # Each source file gets an equal share of dev/test (what one cannot fill goes to the
    # others); false draws them from one global order, so the biggest source dominates.
    heldout_per_source: bool = True
    # Substrings of source paths whose pairs never go to dev/test (they stay in train), such as
    # ["ding-phrases"]: dictionary phrases make BLEU meaningless.
    heldout_exclude: list[str] = field(default_factory=list)
    # A prepared data directory whose dev.tsv and test.tsv are reused as they are, instead of
    # drawing new ones: for experiments that change the filters, whose own draw would move the
    # evaluation sets. Anything linked to them (by normalised source or target) stays out of train.
    heldout_from: str = ""
    # Named groups of sources scored together by ``translate-train evaluate --by-source``:
    # {"dialogue": ["games-dialogue", "cataclysm-dda"]}; a source is named by its file name
    # without the .tsv/.gz/.xz suffixes.
    domains: dict[str, list[str]] = field(default_factory=dict)
    # Copies added to train of each train pair whose one number (2-99) both sides share, with
    # it spelled out ("twenty minutes" / "zwanzig Minuten"; training.number_words): the
    # first with its own number, the others with numbers drawn at random. 0: none.
    spell_numbers: int = 0
    # Copies added to train of each train pair that names one place spelled alike in both
    # languages ("to London" / "nach London"), the place swapped for one the target language
    # names differently ("Vienna" / "Wien"), drawn from the gazetteer ``place_names`` (an
    # English<TAB>target file: the recipe's place-names; training.place_names). Pairs of
    # sources whose path holds one of ``swap_places_skip`` are never used (Bible verses name
    # people and places alike). 0: none.
    swap_places: int = 0
    place_names: str = ""
    swap_places_skip: list[str] = field(default_factory=list)


@dataclass
class VocabConfig:
    size: int = 8000
    model_type: str = "unigram"  # or "bpe"
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000  # SentencePiece samples this many sentences at most
    model_prefix: str = "runs/vocab/spm"
    split_digits: bool = True  # one piece per digit: numbers are copied digit by digit
    # Characters that get their own piece whatever character_coverage leaves out (else they go
    # to byte fallback, 2-4 pieces each): e.g. "€é°" for prices, names and measures.
    required_chars: str = ""
    # Strings that are always one piece, never split or merged (e.g. placeholders "%s").
    user_defined_symbols: list[str] = field(default_factory=list)


@dataclass
class ModelConfig:
    """The paper's hyper-parameters: d_model, d_ff, h, N (encoder and decoder layers)."""

    d_model: int = 512
    d_ff: int = 2048
    heads: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    vocab_size: int = 8000
    max_positions: int = 256
    pre_norm: bool = False  # the paper is post-norm: LayerNorm(x + Sublayer(x))
    layer_norm_eps: float = 1e-6
    # Variations of the paper's model that imported checkpoints use (``training/importers``);
    # the defaults are the paper's, and what ``translate-train train`` builds.
    activation: str = "relu"  # of the feed-forward layer: relu (§3.3) | gelu | swish
    # The sinusoids' layout: "interleaved" (§3.5: sin at even, cos at odd dimensions),
    # "halves" ([sin | cos], as Marian and fairseq lay them out) or "tensor2tensor" ([sin |
    # cos] with wavelengths 10000^(i / (d/2 - 1)), CTranslate2's built-in table, with offset
    # 1); position p reads row p + position_offset of the table.
    position_layout: str = "interleaved"
    position_offset: int = 0
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model) (§3.4)
    # Self-attention with relative position representations clipped at this distance (Shaw
    # et al., 2018; OpenNMT's max_relative_positions) in place of the sinusoids; 0: sinusoids.
    max_relative_positions: int = 0
    # One embedding table for source and target (§3.4, a joint vocabulary); false gives the
    # source its own table of ``source_vocab_size`` rows (``vocab_size`` is the target's).
    shared_embeddings: bool = True
    source_vocab_size: int = 0  # 0: vocab_size
    tie_output: bool = True  # the pre-softmax projection is the target embedding matrix
    output_bias: bool = False  # a bias on the logits (Marian's final_logits_bias)
    # Special ids. ``bos_id`` is the decoder's start token (Marian starts from its pad id).
    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"model.activation {self.activation!r} is not one of {ACTIVATIONS}")
        if self.position_layout not in POSITION_LAYOUTS:
            raise ValueError(f"model.position_layout {self.position_layout!r} is not one of "
                             f"{POSITION_LAYOUTS}")
        if self.shared_embeddings and self.source_vocab_size not in (0, self.vocab_size):
            raise ValueError("model.source_vocab_size differs from vocab_size, so the source "
                             "and target cannot share embeddings (set shared_embeddings=false)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def src_vocab_size(self) -> int:
        return self.source_vocab_size or self.vocab_size

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        presets = {
            "tiny": dict(
                d_model=64,
                d_ff=128,
                heads=4,
                encoder_layers=2,
                decoder_layers=2,
                dropout=0.0,
                max_positions=128,
            ),
            "small": dict(
                d_model=256, d_ff=1024, heads=4, encoder_layers=4, decoder_layers=4, dropout=0.1
            ),
            "base": dict(
                d_model=512, d_ff=2048, heads=8, encoder_layers=6, decoder_layers=6, dropout=0.1
            ),
        }
        if name not in presets:
            raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(presets)}")
        return cls(**{**presets[name], **overrides})


@dataclass
class TrainConfig:
    out_dir: str = "runs/train"
    batch_tokens: int = 4096  # target tokens per step, per process, before accumulation
    accumulate: int = 1
    max_steps: int = 100_000
    max_minutes: float = 0.0  # stop (with a checkpoint) after this wall time; 0 = no limit
    warmup_steps: int = 4000
    lr_scale: float = 1.0  # multiplies the paper's d_model^-0.5 * min(step^-0.5, ...)
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    seed: int = 1
    log_every: int = 50
    validate_every: int = 1000
    checkpoint_every: int = 500
    keep_best: int = 3
    keep_last: int = 5
    average_last: int = 5
    early_stop_patience: int = 0  # validations without BLEU improvement; 0 = never stop early
    dev_bleu_sentences: int = 300
    precision: str = "auto"  # auto (bf16 where native, on CUDA or CPU) | fp32 | bf16 | fp16
    threads: int = 0  # torch intra-op threads on CPU; 0 = torch's default


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def _build(cls: type, values: dict[str, Any]) -> Any:
    """Build a (nested) dataclass from a dict, rejecting unknown keys by name."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(sorted(unknown))}")
    kwargs = {}
    for name, value in values.items():
        target = _FIELD_TYPES.get((cls, name))
        if target is list:
            kwargs[name] = [
                _build(SourceFile, v) if isinstance(v, dict) else SourceFile(str(v)) for v in value
            ]
        elif target is not None:
            kwargs[name] = _build(target, value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


_FIELD_TYPES: dict[tuple[type, str], type] = {
    (Config, "data"): DataConfig,
    (Config, "vocab"): VocabConfig,
    (Config, "train"): TrainConfig,
    (DataConfig, "filters"): FilterConfig,
    (DataConfig, "sources"): list,
}


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare string such as a path


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: tables merge key by key, anything else (lists included,
    so ``data.sources`` as a whole) is replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_toml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's tables, on top of its ``base = "other.toml"`` (relative to the file)
    when it names one, so a variant states only what it changes."""
    path = path.resolve()
    if path in seen:
        raise ValueError(f"config base loop: {' -> '.join(map(str, (*seen, path)))}")
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    base = raw.pop("base", None)
    if base is None:
        return raw
    return _merge(_read_toml(path.parent / base, (*seen, path)), raw)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a TOML config (``[model] preset = "small"`` picks a preset; a top-level
    ``base = "file.toml"`` starts from that file) and apply ``section.field=value`` overrides
    (``train.max_steps=100``, ``model.preset=tiny``)."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(Path(path))
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ValueError(f"override {item!r} must look like section.field=value")
        *parents, leaf = key.strip().split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _parse_value(value.strip())
    model_raw = dict(raw.pop("model", {}))
    preset = model_raw.pop("preset", None)
    config = _build(Config, raw)
    config.model = (
        ModelConfig.preset(preset, **model_raw) if preset else _build(ModelConfig, model_raw)
    )
    return config
