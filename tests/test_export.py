"""Export: the bundle's graphs match PyTorch, and a broken bundle is refused clearly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from service.bundle import BundleError, load_bundle
from training import export
from training.config import ModelConfig
from training.export import load_checkpoint, verify_parity


def test_bundle_has_contract_files_and_checksums(tiny_bundle: Path) -> None:
    bundle = load_bundle(tiny_bundle)
    manifest = bundle.manifest
    assert manifest["contract_version"] == 5
    assert (manifest["source_lang"], manifest["target_lang"]) == ("en", "de")
    assert manifest["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    assert set(manifest["variants"]) == {"fp32", "int8"}
    for name in ("encoder.onnx", "decoder.onnx", "sentencepiece.model"):
        assert len(manifest["files"][name]) == 64
    assert manifest["parity_max_abs_diff"] < 1e-4


def test_onnx_matches_pytorch_over_padded_batches(tiny_checkpoint: Path, tiny_bundle: Path):
    model, _ = load_checkpoint(tiny_checkpoint)
    for seed in range(3):
        assert verify_parity(model, tiny_bundle, steps=8, seed=seed) < 1e-4


def test_export_refuses_a_bundle_that_fails_parity(tiny_checkpoint: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    real_export_graphs = export.export_graphs

    def export_a_different_model(model, out_dir):
        # Graphs of a perturbed copy: what a broken exporter would produce.
        broken, _ = load_checkpoint(tiny_checkpoint)
        with torch.no_grad():
            broken.decoder_layers[0].feed_forward.w_2.weight.mul_(1.5)
        real_export_graphs(broken, out_dir)

    monkeypatch.setattr(export, "export_graphs", export_a_different_model)
    with pytest.raises(RuntimeError, match="parity"):
        export.export_bundle(tiny_checkpoint, tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()
    assert list(tmp_path.iterdir()) == []  # no staging directory left behind


def test_batch_invariance_check_catches_per_tensor_quantisation(tiny_bundle: Path,
                                                                 tmp_path: Path) -> None:
    manifest = json.loads((tiny_bundle / "manifest.json").read_text())
    config = ModelConfig(**{k: v for k, v in manifest["model"].items() if k != "head_dim"})
    export.verify_batch_invariance(tiny_bundle, "encoder.int8.onnx", "decoder.int8.onnx",
                                   config)
    # Dynamic quantisation scales activations per batch: the check must refuse it.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    shutil.copy(tiny_bundle / "encoder.onnx", tmp_path / "encoder.onnx")
    quantize_dynamic(tiny_bundle / "decoder.onnx", tmp_path / "decoder.dynamic.onnx",
                     weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                     extra_options={"DefaultTensorType": 1})  # FLOAT for com.microsoft outputs
    with pytest.raises(RuntimeError, match=r"batch invariance: decoder\.dynamic\.onnx row"):
        export.verify_batch_invariance(tmp_path, "encoder.onnx", "decoder.dynamic.onnx",
                                       config)


@pytest.fixture
def bundle_copy(tiny_bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_bundle, tmp_path / "copy"))


def test_corrupted_file_is_named(bundle_copy: Path) -> None:
    decoder = bundle_copy / "decoder.onnx"
    data = bytearray(decoder.read_bytes())
    data[len(data) // 2] ^= 0xFF
    decoder.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"decoder\.onnx: sha256 mismatch"):
        load_bundle(bundle_copy)


def test_missing_file_is_named(bundle_copy: Path) -> None:
    (bundle_copy / "sentencepiece.model").unlink()
    with pytest.raises(BundleError, match=r"sentencepiece\.model is missing"):
        load_bundle(bundle_copy)


def test_missing_manifest_and_bad_version(bundle_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"no manifest\.json"):
        load_bundle(tmp_path / "nowhere")
    manifest_path = bundle_copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["contract_version"] = 99
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="contract version 99"):
        load_bundle(bundle_copy)
    del manifest["variants"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="missing key"):
        load_bundle(bundle_copy)
    manifest_path.write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(bundle_copy)


def test_decoding_travels_and_a_model_card_survives_re_export(tiny_checkpoint: Path,
                                                              tmp_path: Path) -> None:
    from service.engine import Engine

    out = export.export_bundle(tiny_checkpoint, tmp_path / "b", check_parity=False,
                               decoding={"no_repeat_ngram_size": 1})
    engine = Engine(out, threads=1)
    assert engine.options().no_repeat_ngram_size == 1
    assert engine.options(no_repeat_ngram_size=0).no_repeat_ngram_size == 0
    (out / "MODEL_CARD.md").write_text("# notes a person wrote\n")
    export.export_bundle(tiny_checkpoint, out, check_parity=False)  # re-export in place
    assert (out / "MODEL_CARD.md").read_text() == "# notes a person wrote\n"
    assert Engine(out, threads=1).options().no_repeat_ngram_size == 0
    export.export_bundle(tiny_checkpoint, out, check_parity=False,
                         decoding={"no_repeat_ngram_size": 1})
    with pytest.raises(ValueError, match="unknown key"):
        export.export_bundle(tiny_checkpoint, tmp_path / "c", check_parity=False,
                             decoding={"beam_size": 4})  # a resource policy, the server's call
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["decoding"] = {"no_repeat_ngram_size": -2}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="bad 'decoding'"):
        Engine(out, threads=1)
    manifest["decoding"] = {"temperature": 0.7}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="'decoding' may only hold"):
        load_bundle(out)


def test_a_bundle_gives_back_the_checkpoint_it_was_exported_from(tiny_checkpoint: Path,
                                                                 tiny_bundle: Path,
                                                                 tmp_path: Path) -> None:
    """A shipped bundle can be trained further when its run is gone: ``recover`` returns the
    exact weights, and exporting them again writes the same fp32 graphs, byte for byte."""
    from training.recover import checkpoint_from_bundle

    recovered = torch.load(checkpoint_from_bundle(tiny_bundle, tmp_path / "r.pt"),
                           weights_only=False)
    original = torch.load(tiny_checkpoint, weights_only=False)
    assert recovered["model_config"] == original["model_config"]
    assert recovered["model"].keys() == original["model"].keys()
    for name, tensor in original["model"].items():
        assert torch.equal(recovered["model"][name], tensor), name
    assert recovered["step"] == original["step"]
    assert Path(recovered["vocab"]).read_bytes() == Path(original["vocab"]).read_bytes()

    again = export.export_bundle(tmp_path / "r.pt", tmp_path / "again", check_parity=False)
    shipped = json.loads((tiny_bundle / "manifest.json").read_text())
    manifest = json.loads((again / "manifest.json").read_text())
    for name in ("encoder.onnx", "decoder.onnx", "sentencepiece.model"):
        assert manifest["files"][name] == shipped["files"][name], name
    assert manifest["training"]["sources"] == shipped["training"]["sources"]


@pytest.mark.parametrize("pre_norm", [False, True])
def test_graphs_of_a_model_with_dropout_match_pytorch(tmp_path: Path, pre_norm: bool) -> None:
    """Post-norm and pre-norm models get hand-built graphs that place their norms differently;
    either way exporting must leave the model in eval mode (dropout off) for the parity check.
    The LayerNorms get random weights, so a norm applied in the wrong place shows."""
    from training.config import ModelConfig
    from training.model import Transformer

    torch.manual_seed(0)
    config = ModelConfig(
        d_model=32, d_ff=64, heads=2, encoder_layers=1, decoder_layers=2, dropout=0.3,
        vocab_size=50, max_positions=32, pre_norm=pre_norm,
    )
    model = Transformer(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.5)
                module.bias.normal_(0.0, 0.5)
    export.export_graphs(model, tmp_path)
    assert not model.training
    assert verify_parity(model, tmp_path, steps=4) < 1e-4


def test_int8_graphs_multiply_in_integers(tiny_bundle: Path) -> None:
    """Every matrix product that had a float weight is an integer one reading int8 weights
    and a uint8 activation quantised with a constant scale (the batch-invariant static form),
    and takes its bias itself rather than leaving an Add behind it."""
    import onnx

    for name in ("encoder", "decoder"):
        fp32 = onnx.load(str(tiny_bundle / f"{name}.onnx"))
        fp32_weights = {init.name for init in fp32.graph.initializer}
        weighted = [n for n in fp32.graph.node
                    if n.op_type == "MatMul" and n.input[1] in fp32_weights]
        int8 = onnx.load(str(tiny_bundle / f"{name}.int8.onnx"))
        weights = {init.name: init for init in int8.graph.initializer}
        producers = {out: n for n in int8.graph.node for out in n.output}
        products = [n for n in int8.graph.node if n.op_type == "MatMulIntegerToFloat"]
        assert weighted and len(products) == len(weighted)
        assert not any(n.op_type == "MatMul" and n.input[1] in weights for n in int8.graph.node)
        for node in products:
            assert weights[node.input[1]].data_type == onnx.TensorProto.INT8
            quantize = producers[node.input[0]]
            assert quantize.op_type == "QuantizeLinear"
            assert all(i in weights for i in quantize.input[1:])  # constant scale and zero
            assert node.input[2] in weights and node.input[4] in weights
        readers = {i: n for n in int8.graph.node for i in n.input}
        assert not any(readers.get(n.output[0]) is not None
                       and readers[n.output[0]].op_type == "Add"
                       and any(i in weights for i in readers[n.output[0]].input)
                       for n in products)
        if name == "decoder":  # Q/K/V, cross Q and the first feed-forward layer have biases
            assert sum(len(n.input) == 7 for n in products) >= 3


def test_int8_export_names_missing_calibration_sentences(tiny_checkpoint: Path,
                                                         tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.tsv"
    with pytest.raises(FileNotFoundError, match=r"nowhere\.tsv"):
        export.export_bundle(tiny_checkpoint, tmp_path / "b", int8=True, calibration=missing)
    assert not (tmp_path / "b").exists()


def test_a_weight_read_by_two_products_is_quantised_once(tmp_path: Path) -> None:
    """Two MatMuls sharing one weight (and one input) give a valid graph with one int8 copy,
    and it computes what the float graph does, to int8 precision."""
    import types

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from training.quantize import quantize_graph

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="a"),
         helper.make_node("MatMul", ["x", "w"], ["b"], name="b"),
         helper.make_node("Add", ["a", "b"], ["y"], name="y")],
        "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save(model, str(tmp_path / "fp32.onnx"))
    x = rng.uniform(-1, 1, (2, 8)).astype(np.float32)
    quantize_graph(tmp_path / "fp32.onnx", tmp_path / "int8.onnx",
                   types.SimpleNamespace(low={"x": -1.0}, high={"x": 1.0}, weights={"w"}))
    int8 = onnx.load(str(tmp_path / "int8.onnx"))
    onnx.checker.check_model(int8)
    ops = [n.op_type for n in int8.graph.node]
    assert ops.count("QuantizeLinear") == 1 and ops.count("MatMulIntegerToFloat") == 2
    assert len([i for i in int8.graph.initializer if i.data_type == onnx.TensorProto.INT8]) == 1
    y = ort.InferenceSession(str(tmp_path / "int8.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, 2 * x @ w, atol=0.1)


@pytest.mark.parametrize("variation", [
    # pre-norm, relative positions, head size 4 (plain attention), untied output with a bias
    dict(pre_norm=True, max_relative_positions=3, heads=16, tie_output=False, output_bias=True),
    dict(pre_norm=False, max_relative_positions=0, heads=4, tie_output=True, output_bias=False,
         scale_embeddings=False, activation="gelu"),
])
def test_recover_gives_back_every_kind_of_model_export_writes(
        overfit_vocab: Path, tmp_path: Path, variation: dict) -> None:
    """Not only the models trained here: whatever variation export bakes into the graphs
    (the importers' models among them) comes back as the weights it was exported from."""
    import dataclasses

    from tests.conftest import OVERFIT_VOCAB_SIZE
    from training.model import Transformer
    from training.recover import checkpoint_from_bundle

    torch.manual_seed(0)
    config = ModelConfig(d_model=64, d_ff=96, encoder_layers=2, decoder_layers=2, dropout=0.0,
                         vocab_size=OVERFIT_VOCAB_SIZE, max_positions=64, **variation)
    model = Transformer(config)
    with torch.no_grad():
        for parameter in model.parameters():  # none left at zero (biases, tables)
            parameter.add_(torch.randn_like(parameter) * 0.1)
        model.embeddings.lut.weight[config.pad_id] = 0
    checkpoint = tmp_path / "model.pt"
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(config),
                "vocab": str(overfit_vocab), "step": 7}, checkpoint)
    bundle = export.export_bundle(checkpoint, tmp_path / "bundle")  # parity checked
    recovered = torch.load(checkpoint_from_bundle(bundle, tmp_path / "r.pt"), weights_only=False)
    assert recovered["model"].keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        got = recovered["model"][name]
        if name == "output_bias":  # lost for the tokens never generated, which never use it
            never = model.never_generate
            assert torch.equal(got[~never], tensor[~never]) and not got[never].any()
        else:
            assert torch.allclose(got, tensor, atol=1e-6, rtol=0), name
