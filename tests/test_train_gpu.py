"""The GPU path, run on a CPU: weights packed into small fp16 shards come back whole, and
scripts/train-gpu.sh carries prepared data, trains with bf16 autocast and returns a checkpoint
that export and --init-from can read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.shards import MANIFEST, pack_checkpoint, unpack_checkpoint
from training.train import init_model, load_checkpoint

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "overfit.tsv"
LIMIT_FILES, LIMIT_BYTES = 8, 16 * 2**20  # what a device call brings back


def _fp16(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.float16).to(tensor.dtype) if tensor.is_floating_point() else tensor


def test_packed_weights_come_back_as_fp16_rounded_fp32(make_train_config, tmp_path: Path):
    config = make_train_config()
    model = init_model(config)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "model_config": {"d_model": 64}, "step": 7,
                "config": {"data": {"out_dir": "gpu/data"}}, "metrics": {"bleu": 1.5},
                "optimizer": {"state": "left behind"}, "vocab": "/elsewhere/spm.model"}, path)
    # A limit smaller than the embedding table makes it travel in row blocks.
    files = pack_checkpoint(path, tmp_path / "packed", shard_bytes=40_000)
    assert len(files) > 3 and files[-1].name == MANIFEST
    assert all(f.stat().st_size <= 40_000 for f in files[:-1])
    vocab = tmp_path / "spm.model"
    vocab.write_bytes(b"x")
    out = unpack_checkpoint(tmp_path / "packed", tmp_path / "back.pt", vocab=vocab,
                            data_dir="runs/en-de/data")
    back = load_checkpoint(out)
    assert back["step"] == 7 and back["metrics"] == {"bleu": 1.5} and "optimizer" not in back
    assert back["vocab"] == str(vocab.resolve())
    assert back["config"]["data"]["out_dir"] == "runs/en-de/data"
    state = model.state_dict()
    assert back["model"].keys() == state.keys()
    for name, tensor in state.items():
        assert back["model"][name].dtype == tensor.dtype
        assert torch.equal(back["model"][name], _fp16(tensor)), name


def test_a_damaged_shard_is_refused(make_train_config, tmp_path: Path):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": init_model(make_train_config()).state_dict(), "step": 1}, path)
    files = pack_checkpoint(path, tmp_path / "packed")
    data = bytearray(files[0].read_bytes())
    data[-100] ^= 0xFF
    files[0].write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        unpack_checkpoint(tmp_path / "packed", tmp_path / "back.pt", vocab=path)


def test_train_gpu_script_runs_end_to_end_tiny_on_cpu(overfit_vocab: Path, tmp_path: Path):
    data = tmp_path / "prepared"
    data.mkdir()
    for split in ("train", "dev"):
        shutil.copyfile(FIXTURE, data / f"{split}.tsv")
    env = {**os.environ, "TINY": "1", "CARRY": str(tmp_path / "gpu"), "OUT": str(tmp_path / "out"),
           "DATA_DIR": str(data), "VOCAB": str(overfit_vocab), "PYTHON": sys.executable,
           "FETCH_TO": str(tmp_path / "back" / "checkpoint_avg.pt")}
    run = subprocess.run([str(ROOT / "scripts" / "train-gpu.sh"), "carry", "train", "fetch", "--",
                          "--set", "train.threads=1"], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The carried data is compressed, and training read it so.
    assert (tmp_path / "gpu" / "data" / "train.tsv.xz").is_file()
    assert not (tmp_path / "gpu" / "data" / "train.tsv").exists()
    assert not (tmp_path / "gpu" / "data" / "cache").exists()  # it must not travel next time
    result = sorted((tmp_path / "out" / "result").iterdir())
    assert len(result) <= LIMIT_FILES and all(f.stat().st_size <= LIMIT_BYTES for f in result)
    manifest = json.loads((tmp_path / "out" / "result" / MANIFEST).read_text())
    assert manifest["step"] == 20 and manifest["config"]["train"]["precision"] == "bf16"
    assert manifest["model_config"]["encoder_layers"] == 6
    assert manifest["model_config"]["decoder_layers"] == 2
    averaged = load_checkpoint(tmp_path / "gpu" / "train" / "checkpoint_avg.pt")
    assert len(averaged["averaged_from"]) == 4  # checkpoints 5, 10, 15, 20
    back = load_checkpoint(tmp_path / "back" / "checkpoint_avg.pt")
    assert back["vocab"] == str(overfit_vocab.resolve())
    for name, tensor in averaged["model"].items():
        assert torch.equal(back["model"][name], _fp16(tensor)), name


def test_the_gpu_configs_model_fits_what_a_device_call_brings_back(tmp_path: Path):
    from training.config import load_config

    config = load_config(ROOT / "configs" / "en-de-gpu.toml")
    path = tmp_path / "ckpt.pt"
    torch.save({"model": init_model(config).state_dict(), "step": 0}, path)
    files = pack_checkpoint(path, tmp_path / "result")
    # Beside the shards and weights.json the result holds metrics.jsonl and train.log.
    assert len(files) + 2 <= LIMIT_FILES
    assert all(f.stat().st_size <= LIMIT_BYTES for f in files)
    assert sum(f.stat().st_size for f in files) <= 62 * 2**20  # 2 MiB left for the logs
