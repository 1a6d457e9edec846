"""The fp16 variant, for onnxruntime's CUDA provider: exported beside the fp32 graphs, typed as
the contract says, and decoding the tiny model's fixture as fp32 does. onnxruntime's CPU
provider runs the fp16 graphs (casting around the nodes it has no fp16 kernel for), so its
numbers are checked here; the CUDA run itself is scripts/gpu-check.sh's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from service.bundle import load_bundle
from service.device_cache import cuda_runs
from service.engine import Engine
from service.search import DecodeOptions
from tests.conftest import OVERFIT_TSV
from training import cli

F16, F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT


@pytest.fixture(scope="module")
def fp16_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model exported with ``translate-train export ... --fp16``."""
    out = tmp_path_factory.mktemp("fp16") / "en-de"
    cli.main(["export", str(tiny_checkpoint), str(out), "--fp16"])
    return out


def _types(path: Path) -> dict[str, int]:
    graph = onnx.load(str(path)).graph
    return {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}


def test_export_lists_the_fp16_variant(fp16_bundle: Path) -> None:
    bundle = load_bundle(fp16_bundle)  # every file, the fp16 graphs included, checksummed
    variant = bundle.manifest["variants"]["fp16"]
    assert bundle.graph_paths("fp16") == (fp16_bundle / "encoder.fp16.onnx",
                                          fp16_bundle / "decoder.fp16.onnx")
    assert {"encoder.fp16.onnx", "decoder.fp16.onnx"} <= set(bundle.manifest["files"])
    assert bundle.manifest["default_variant"] == "fp32"
    # Measured on random sources at export: a few hundredths here (0.019 on an AMD EPYC);
    # a near-tie on random input may flip a step's choice on another CPU's weights.
    parity = variant["parity_vs_fp32"]
    assert parity["greedy_agreement"] >= 0.95 and parity["max_abs_log_prob_top"] < 0.1


def test_fp16_graphs_keep_caches_in_half_and_log_probs_in_float(fp16_bundle: Path) -> None:
    """The caches the service keeps on the device are float16 (half the memory); the log-probs
    the search ranks stay float32."""
    encoder = _types(fp16_bundle / "encoder.fp16.onnx")
    assert encoder["cross_keys"] == encoder["cross_values"] == encoder["cross_last"] == F16
    decoder = _types(fp16_bundle / "decoder.fp16.onnx")
    layers = json.loads((fp16_bundle / "manifest.json").read_text())["model"]["decoder_layers"]
    for i in range(layers):
        for name in ("self_keys", "self_values", "cross_keys", "cross_values", "present_keys",
                     "present_values", "present_cross_keys", "present_cross_values"):
            assert decoder[f"{name}_{i}"] == F16, name
    assert decoder["cross_last"] == F16
    assert decoder["log_probs"] == F32
    graph = onnx.load(str(fp16_bundle / "decoder.fp16.onnx")).graph
    producers = {output: node for node in graph.node for output in node.output}
    assert producers["log_probs"].op_type == "LogSoftmax"  # computed in float32, not cast to it


@pytest.mark.parametrize("beam_size", [1, 4])
def test_fp16_decodes_the_fixture_as_fp32_does(fp16_bundle: Path, beam_size: int) -> None:
    """The same tokens from fp16 as from fp32, with the caches in numpy buffers and in
    OrtValues (the device cache CUDA uses, here on the CPU provider)."""
    sources = [line.split("\t")[0] for line in OVERFIT_TSV.read_text("utf-8").splitlines()]
    results = {}
    for variant, device_cache in (("fp32", False), ("fp16", False), ("fp16", True)):
        engine = Engine(fp16_bundle, device="cpu", variant=variant, threads=1,
                        device_cache=device_cache)
        assert engine.cache_dtype.name == {"fp32": "float32", "fp16": "float16"}[variant]
        results[variant, device_cache] = engine.translate(sources, beam_size=beam_size)
    assert len(results["fp16", False]) == 64
    full = results["fp32", False]
    for half in (results["fp16", False], results["fp16", True]):
        for ours, theirs in zip(half, full, strict=True):
            assert ours.hypotheses[0].token_ids == theirs.hypotheses[0].token_ids
            assert abs(ours.score - theirs.score) < 0.01
    assert [r.score for r in results["fp16", True]] == [r.score for r in results["fp16", False]]


def test_cuda_picks_fp16_when_the_bundle_has_it(fp16_bundle: Path, tiny_bundle: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the provider choice is faked: this onnxruntime build has no CUDA and falls back.
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr("onnxruntime.get_available_providers", lambda: available)
    monkeypatch.setattr("service.engine.cuda_runs", lambda: True)
    engine = Engine(fp16_bundle, device="cuda", threads=1)
    assert (engine.variant, engine.device_cache) == ("fp16", True)
    assert Engine(tiny_bundle, device="cuda", threads=1).variant == "fp32"  # no fp16 there


def test_cpu_never_picks_fp16_by_default(fp16_bundle: Path) -> None:
    assert Engine(fp16_bundle, device="cpu").variant == "fp32"


def test_fp16_command_adds_the_variant_to_a_bundle(tiny_bundle: Path, tmp_path: Path) -> None:
    """``translate-train fp16 BUNDLE``: what the CUDA image runs on the default model."""
    bundle = shutil.copytree(tiny_bundle, tmp_path / "en-de")
    before = load_bundle(bundle).manifest
    cli.main(["fp16", str(bundle)])
    loaded = load_bundle(bundle)  # the new graphs checksummed
    assert set(loaded.manifest["variants"]) == {"fp32", "int8", "fp16"}
    assert loaded.manifest["default_variant"] == before["default_variant"]  # CPUs unchanged
    engine = Engine(bundle, device="cpu", variant="fp16", threads=1)
    assert engine.translate(["Hello."])[0].text == Engine(
        bundle, device="cpu", variant="fp32", threads=1).translate(["Hello."])[0].text


@pytest.mark.skipif(not cuda_runs(), reason="no CUDA device (scripts/gpu-check.sh runs this)")
@pytest.mark.parametrize("variant", ["fp16", "fp32"])
def test_cuda_decodes_the_fixture_as_the_cpu_does(fp16_bundle: Path, variant: str) -> None:
    """On a GPU, with the caches in device memory: offline batches of greedy and beam search,
    then sentences joining a running batch and one leaving it, all the CPU's fp32 tokens."""
    sources = [line.split("\t")[0] for line in OVERFIT_TSV.read_text("utf-8").splitlines()]
    cpu = Engine(fp16_bundle, device="cpu", variant="fp32", threads=1)
    gpu = Engine(fp16_bundle, device="cuda", variant=variant)
    assert gpu.device == "cuda" and gpu.device_cache
    for beam_size in (1, 4):
        expected = cpu.translate(sources, beam_size=beam_size)
        got = gpu.translate(sources, beam_size=beam_size, max_batch_rows=16)
        assert [r.hypotheses[0].token_ids for r in got] == [
            r.hypotheses[0].token_ids for r in expected]
    expected = {i: cpu.translate([s], beam_size=1 + i % 2)[0].text
                for i, s in enumerate(sources[:12])}
    batch, results = gpu.new_batch(), {}
    batch.add("left", gpu.tokenize(sources[20]), DecodeOptions())
    for step in range(300):
        if step < 12:
            batch.add(step, gpu.tokenize(sources[step]), DecodeOptions(beam_size=1 + step % 2))
        if step == 3:
            batch.remove("left")
        results.update(batch.step())
        if step >= 12 and not len(batch):
            break
    assert {k: v.text for k, v in results.items()} == expected
    assert np.isfinite(batch.cache.log_probs).all()
