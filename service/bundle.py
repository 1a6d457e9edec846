"""A model bundle: the only thing training and serving share.

ONNX contract v1 (all axes but layers/heads/head_dim dynamic):

``encoder.onnx``  src_tokens int64 [batch, src_len]
                  -> cross_keys, cross_values float [layers, batch, heads, src_len, head_dim]
                     (every decoder layer's cross-attention keys/values, computed once),
                     src_mask bool [batch, src_len] (True = real token)
``decoder.onnx``  tokens, positions int64 [batch]; self_keys, self_values
                  [layers, batch, heads, past, head_dim]; self_mask bool [batch, past + 1]
                  (last column = the current token); cross_keys, cross_values, src_mask
                  -> log_probs float [batch, vocab]; present_keys, present_values
                     [layers, batch, heads, past + 1, head_dim] (the cache to feed back)

``manifest.json`` records the contract version, languages, special ids, dimensions, the
variants (fp32, int8) and the sha256 of every file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTRACT_VERSION = 1
MANIFEST = "manifest.json"
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


class BundleError(ValueError):
    """A bundle is missing, incomplete, corrupted or of an unsupported contract version."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    if manifest["contract_version"] != CONTRACT_VERSION:
        raise BundleError(
            f"{manifest_path}: contract version {manifest['contract_version']!r}, "
            f"this service speaks version {CONTRACT_VERSION}"
        )
    files: dict[str, str] = manifest["files"]
    referenced = {manifest["tokenizer"]}
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
    return Bundle(directory, manifest)


def discover_bundles(models_dir: str | Path) -> list[Path]:
    """Subdirectories of ``models_dir`` that hold a manifest, sorted by name."""
    root = Path(models_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / MANIFEST).is_file())
