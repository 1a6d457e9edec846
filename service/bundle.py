"""A model bundle: the only thing training and serving share.

ONNX contract v5 (all axes but heads/head_dim dynamic; ``i`` runs over the decoder layers):

``encoder.onnx``  src_tokens int64 [batch, src_len]
                  -> cross_keys, cross_values float [layers, batch, heads, src_len, head_dim]
                     (every decoder layer's cross-attention keys/values, computed once),
                     src_mask bool [batch, src_len] (True = real token),
                     cross_last float [batch, 1, layers * 2 * d_model] (each row's key and
                     value at its last real source position: layer 0's key, its value,
                     layer 1's key, ...; see below)
``decoder.onnx``  tokens, positions int64 [batch]; src_mask; cross_last; and per layer
                  ``self_keys_i``, ``self_values_i`` [batch, heads, past, head_dim],
                  ``cross_keys_i``, ``cross_values_i`` [batch, heads, src_len, head_dim]
                  -> log_probs float [batch, vocab]; per layer ``present_keys_i``,
                     ``present_values_i`` [batch, heads, max(past, max(positions) + 1),
                     head_dim] (fed back), then ``present_cross_keys_i``,
                     ``present_cross_values_i`` (the cross caches, unchanged)

A row's self cache is left-aligned: its ``positions`` earlier tokens fill columns
0 .. position - 1, and this step writes its key/value at column ``position``; later columns are
never read. So each row attends over its own history only, whatever the others' lengths: rows
that joined at different steps cost no masked columns, and their numbers do not depend on their
neighbours (onnxruntime's GroupQueryAttention reads ``positions`` as per-row cache lengths).
Cross-attention likewise reads each row's real source positions only (``src_mask``), not the
batch's padded width. The kernel that does it appends a "new" key/value to each row's cache,
so the row's last source key/value is passed again as that: ``cross_last``, which the encoder
computes once per sentence (v3 gathered it from the caches in the decoder, 25 kernels a step).
Every present output may be bound to its input's buffer, and is then written in place (no copy
of the cache per step); unbound, it is a copy.

v5 keeps v4's graphs and lets the manifest describe models imported from elsewhere
(``training/importers``): ``special_ids`` may be any ids (``bos`` is the decoder's start
token), ``model`` records the variations baked into the graphs (activation, position layout,
separate or tied embeddings, logits bias; see ``training.config.ModelConfig``), and optional
keys name a ``target_tokenizer``, a ``vocabulary`` mapping SentencePiece pieces to the model's
ids and the ``target_languages`` of a multilingual model (``service/vocabulary.py``), and
``source_format``: what a source gets besides its pieces, ``{"add_bos": false, "add_eos":
true}`` when absent (a model trained here, a Marian model) while OpenNMT-py's models, and so
Argos Translate's, read sources without EOS. v4 bundles load unchanged.

v3 differed only in gathering ``cross_last`` inside the decoder step. v2 kept every row's
history right-aligned in one shared width with a self mask: a row that joined late attended
over the masked columns of the oldest row's history (serving 64 clients, 4x the columns a row
needed). v1 stacked the caches [layers, ...], copying them three times a step.

``manifest.json`` records the contract version, languages, special ids, dimensions, the
variants (fp32; int8 for CPUs; fp16 for CUDA, whose graphs take and return every cache and
``cross_last`` in float16 and ``log_probs`` in float32: ``training/fp16.py``) and the sha256 of
every file. A variant's graphs have the same inputs and outputs; only the float type differs,
which the service reads from the graph, so the fp16 variant needs no new contract version.

Its optional ``decoding`` holds the decoding settings measured best for this model
(``DECODING_KEYS``), as Hugging Face's generation_config does: they travel with the model, not
with whatever serves it.

Its optional ``terms`` names a TSV file of place names, English name and the target
language's own (``Vienna\tWien``), which the service writes the target language's way
(``service.glossary.Terms`` with ``names``; the setting PLACE_NAMES): a small model copies the
names it sees and the exonyms with them. ``translate-train place-names`` writes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTRACT_VERSION = 5
SUPPORTED_VERSIONS = (4, 5)  # v4 bundles are v5 bundles without the optional keys
CACHE_INPUTS = ("self_keys", "self_values", "cross_keys", "cross_values")
MANIFEST = "manifest.json"
# How to decode this model well; beam size and lengths stay the server's resource policy.
DECODING_KEYS = ("length_penalty", "max_length_ratio", "no_repeat_ngram_size", "digits_from_source")
REQUIRED_KEYS = (
    "contract_version",
    "source_lang",
    "target_lang",
    "special_ids",
    "model",
    "max_positions",
    "tokenizer",
    "variants",
    "default_variant",
    "files",
)


def decoder_inputs(layers: int) -> list[str]:
    """The decoder graph's input names, in order."""
    per_layer = [f"{name}_{i}" for i in range(layers) for name in CACHE_INPUTS]
    return ["tokens", "positions", "src_mask", "cross_last", *per_layer]


def decoder_outputs(layers: int) -> list[str]:
    """The decoder graph's output names, in order: log_probs, then each layer's self key,
    value, then each layer's cross key, value (the cross inputs, written in place)."""
    per_layer = [f"present_{name}_{i}" for i in range(layers) for name in ("keys", "values")]
    cross = [f"present_cross_{name}_{i}" for i in range(layers) for name in ("keys", "values")]
    return ["log_probs", *per_layer, *cross]


def per_layer(name: str, arrays: Sequence[Any]) -> dict[str, Any]:
    """Feeds ``name_0``, ``name_1``, ... from a list or a stacked [layers, ...] array (whose
    layers are contiguous views: nothing is copied)."""
    return {f"{name}_{i}": array for i, array in enumerate(arrays)}


def decoder_feeds(tokens: Any, positions: Any, self_keys: Sequence[Any],
                  self_values: Sequence[Any], cross_keys: Sequence[Any],
                  cross_values: Sequence[Any], src_mask: Any, cross_last: Any,
                  ) -> dict[str, Any]:
    """The decoder graph's feeds; each cache is a list of layers or a stacked array."""
    return {
        "tokens": tokens,
        "positions": positions,
        "src_mask": src_mask,
        "cross_last": cross_last,
        **per_layer("self_keys", self_keys),
        **per_layer("self_values", self_values),
        **per_layer("cross_keys", cross_keys),
        **per_layer("cross_values", cross_values),
    }


class BundleError(ValueError):
    """A bundle is missing, incomplete, corrupted or of an unsupported contract version."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, manifest: dict[str, Any], added: Iterable[str] = ()) -> None:
    """``manifest`` as ``directory``'s, with the checksums of the files ``added`` to it (files
    the bundle gained after its export: fp16 graphs, place names)."""
    files = manifest.setdefault("files", {})
    for name in added:
        files[name] = sha256_file(directory / name)
    manifest["files"] = dict(sorted(files.items()))
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Bundle:
    dir: Path
    manifest: dict[str, Any]

    @property
    def source_lang(self) -> str:
        return self.manifest["source_lang"]

    @property
    def target_lang(self) -> str:
        return self.manifest["target_lang"]

    @property
    def max_positions(self) -> int:
        return int(self.manifest["max_positions"])

    @property
    def special_ids(self) -> dict[str, int]:
        return self.manifest["special_ids"]

    @property
    def tokenizer_path(self) -> Path:
        return self.dir / self.manifest["tokenizer"]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The (source, target) language pairs it translates: one per target language of a
        multilingual model."""
        targets = sorted(self.manifest.get("target_languages") or [self.target_lang])
        return [(self.source_lang, target) for target in targets]

    @property
    def decoding(self) -> dict[str, Any]:
        """The model's recommended decoding settings (a subset of ``DECODING_KEYS``)."""
        return dict(self.manifest.get("decoding", {}))

    @functools.cached_property
    def terms(self) -> dict[str, str]:
        """The place names of ``terms``, source name -> target name (empty when none); read
        once."""
        name = self.manifest.get("terms")
        return read_terms(self.dir / name) if name else {}

    def graph_paths(self, variant: str | None = None) -> tuple[Path, Path]:
        """(encoder, decoder) paths of ``variant`` (the manifest's default when None)."""
        name = variant or self.manifest["default_variant"]
        variants = self.manifest["variants"]
        if name not in variants:
            raise BundleError(f"{self.dir}: no variant {name!r}; it has {sorted(variants)}")
        return self.dir / variants[name]["encoder"], self.dir / variants[name]["decoder"]


def load_bundle(path: str | Path, verify_checksums: bool = True) -> Bundle:
    """Read and validate a bundle; every problem is reported with the file it concerns."""
    directory = Path(path)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise BundleError(f"{directory}: no {MANIFEST} (is this a model bundle directory?)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{manifest_path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict):
        raise BundleError(f"{manifest_path}: expected a JSON object")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise BundleError(f"{manifest_path}: missing key(s) {', '.join(missing)}")
    if manifest["contract_version"] not in SUPPORTED_VERSIONS:
        raise BundleError(
            f"{manifest_path}: contract version {manifest['contract_version']!r}, "
            f"this service speaks versions {', '.join(map(str, SUPPORTED_VERSIONS))} "
            "(re-export the checkpoint with `translate-train export`)"
        )
    decoding = manifest.get("decoding", {})
    if not isinstance(decoding, dict) or set(decoding) - set(DECODING_KEYS):
        raise BundleError(
            f"{manifest_path}: 'decoding' may only hold {', '.join(DECODING_KEYS)}; "
            f"got {decoding!r}"
        )
    files: dict[str, str] = manifest["files"]
    referenced = {manifest["tokenizer"], *manifest.get("vocabulary", {}).values()}
    if manifest.get("target_tokenizer"):
        referenced.add(manifest["target_tokenizer"])
    if manifest.get("terms"):
        referenced.add(manifest["terms"])
    for variant in manifest["variants"].values():
        referenced.update((variant["encoder"], variant["decoder"]))
    unlisted = referenced - set(files)
    if unlisted:
        raise BundleError(f"{manifest_path}: no checksum for {', '.join(sorted(unlisted))}")
    for name, expected in files.items():
        file = directory / name
        if not file.is_file():
            raise BundleError(f"{directory}: {name} is missing (listed in {MANIFEST})")
        if verify_checksums and sha256_file(file) != expected:
            raise BundleError(f"{file}: sha256 mismatch; the file is corrupted or was replaced")
    bundle = Bundle(directory, manifest)
    _ = bundle.terms  # read now: a malformed terms file is refused at load, not at a request
    return bundle


def read_terms(path: Path) -> dict[str, str]:
    """A TSV of source term, tab, target term per line; '#' starts a comment line."""
    terms: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not all(field.strip() for field in fields):
            raise BundleError(f"{path}:{number}: expected 'source term<TAB>target term'")
        terms[fields[0].strip()] = fields[1].strip()
    return terms


def discover_bundles(models_dir: str | Path) -> list[Path]:
    """Subdirectories of ``models_dir`` that hold a manifest, sorted by name."""
    root = Path(models_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / MANIFEST).is_file())
