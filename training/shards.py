"""A checkpoint's weights as a few files of bounded size, and back.

A GPU machine that trains for us returns at most a few files of limited size (8 of 16 MiB on
the one this project borrows). ``pack_checkpoint`` writes a checkpoint's model parameters in
fp16 (half of fp32's bytes; bf16 would keep three mantissa bits fewer) in as few shards under
a byte limit as it can, tensors larger than a shard cut by rows, with a manifest;
``unpack_checkpoint`` joins them into an fp32 checkpoint that ``export`` and ``train
--init-from`` read. Optimiser state stays behind: it is twice the model's size, and a
continued run starts a fresh optimiser.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

MANIFEST = "weights.json"
SHARD_BYTES = 16 * 2**20 - 2**16  # a file's size, under the 16 MiB a returned file may have
# What torch.save adds: ~1.5 KB a file, ~230 bytes a tensor and up to 63 bytes of alignment
# (measured with torch 2.x); counted generously so that a shard's file stays within the limit.
_FILE_OVERHEAD, _TENSOR_OVERHEAD = 4096, 512
_FP16_MAX = torch.finfo(torch.float16).max
_KEPT_KEYS = ("model_config", "config", "step", "metrics", "averaged_from")


def _pieces(name: str, tensor: torch.Tensor, limit: int) -> list[tuple[str, torch.Tensor]]:
    """``tensor`` whole, or cut into row blocks of at most ``limit`` bytes each."""
    if tensor.numel() * tensor.element_size() <= limit or tensor.dim() == 0:
        return [(name, tensor)]
    row_bytes = max(tensor[0].numel() * tensor.element_size(), 1)
    rows = max(limit // row_bytes, 1)
    return [(f"{name}#{k}", block.clone()) for k, block in enumerate(tensor.split(rows))]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pack_checkpoint(checkpoint: str | Path, out_dir: str | Path, *,
                    shard_bytes: int = SHARD_BYTES) -> list[Path]:
    """Write ``weights-{k}.pt`` shards and ``weights.json`` into ``out_dir``; return them."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pieces: list[tuple[str, torch.Tensor]] = []
    parts: dict[str, list[str]] = {}
    for name, tensor in ckpt["model"].items():
        if tensor.is_floating_point():
            peak = tensor.abs().max().item() if tensor.numel() else 0.0
            if peak > _FP16_MAX:
                raise ValueError(f"{name}: |value| {peak:g} does not fit fp16")
            tensor = tensor.to(torch.float16)
        cut = _pieces(name, tensor, shard_bytes - _FILE_OVERHEAD - _TENSOR_OVERHEAD)
        parts[name] = [piece_name for piece_name, _ in cut]
        pieces += cut
    # First fit, largest first: as few shards as the sizes allow (the file count is limited).
    shards: list[dict[str, torch.Tensor]] = []
    sizes: list[int] = []
    room = shard_bytes - _FILE_OVERHEAD
    for piece_name, piece in sorted(pieces, key=lambda p: -p[1].numel() * p[1].element_size()):
        size = piece.numel() * piece.element_size() + _TENSOR_OVERHEAD
        k = next((k for k, used in enumerate(sizes) if used + size <= room), len(sizes))
        if k == len(sizes):
            shards.append({})
            sizes.append(0)
        shards[k][piece_name] = piece.contiguous()
        sizes[k] += size
    paths = []
    for k, shard in enumerate(shards):
        path = out_dir / f"weights-{k}.pt"
        torch.save(shard, path)
        paths.append(path)
    manifest = {key: ckpt.get(key) for key in _KEPT_KEYS}
    manifest.update(
        stored_dtype="float16",
        dtypes={name: str(tensor.dtype).removeprefix("torch.")
                for name, tensor in ckpt["model"].items()},
        parts=parts,
        shards={path.name: _sha256(path) for path in paths},
    )
    manifest_path = out_dir / MANIFEST
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return [*paths, manifest_path]


def unpack_checkpoint(in_dir: str | Path, out_path: str | Path, *, vocab: str | Path,
                      data_dir: str | Path | None = None) -> Path:
    """Join the shards in ``in_dir`` into the checkpoint ``out_path`` (parameters back in their
    original dtype). ``vocab`` is this machine's copy of the SentencePiece model the weights
    were trained with; ``data_dir``, if given, replaces ``config.data.out_dir`` (where export
    looks for calibration sentences)."""
    in_dir, out_path = Path(in_dir), Path(out_path)
    manifest: dict[str, Any] = json.loads((in_dir / MANIFEST).read_text(encoding="utf-8"))
    tensors: dict[str, torch.Tensor] = {}
    for name, digest in manifest["shards"].items():
        path = in_dir / name
        if _sha256(path) != digest:
            raise ValueError(f"{path}: checksum differs from {MANIFEST}: a broken transfer?")
        tensors.update(torch.load(path, map_location="cpu", weights_only=True))
    model = {}
    for name, pieces in manifest["parts"].items():
        joined = torch.cat([tensors[p] for p in pieces]) if len(pieces) > 1 else tensors[pieces[0]]
        model[name] = joined.to(getattr(torch, manifest["dtypes"][name]))
    ckpt = {key: manifest.get(key) for key in _KEPT_KEYS}
    ckpt["model"] = model
    ckpt["vocab"] = str(Path(vocab).resolve())
    if data_dir is not None and ckpt.get("config"):
        ckpt["config"]["data"]["out_dir"] = str(data_dir)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, out_path)
    return out_path
