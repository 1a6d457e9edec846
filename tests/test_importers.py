"""Models published elsewhere, imported: the bundle decodes what the original decodes.

The reference is the original's own implementation (``transformers``' generate), on a model
trained here in seconds until it translates the overfit fixture (``conftest.marian_dir``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.bundle import load_bundle
from service.engine import Engine
from tests.conftest import MARIAN_LANGUAGES, OVERFIT_TSV
from training.importers import UnsupportedModel, import_model

SOURCES = [line.split("\t")[0] for line in OVERFIT_TSV.read_text(encoding="utf-8").splitlines()]
GERMAN = MARIAN_LANGUAGES[0]


@pytest.fixture(scope="module")
def marian_bundle(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported")
    calibration = out / "calibration.txt"
    calibration.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    return import_model(marian_dir, out / "en-mul", int8=True, fp16=True,
                        calibration=calibration, default_variant="fp32")


def reference(marian_dir: Path, beam: int) -> list[list[int]]:
    """transformers' own output ids for each source (start token and EOS left out)."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(marian_dir)
    model = MarianMTModel.from_pretrained(marian_dir).eval()
    outputs = []
    with torch.no_grad():
        for source in SOURCES:
            encoded = tokenizer([f"{GERMAN} {source}"], return_tensors="pt")
            ids = model.generate(**encoded, num_beams=beam, length_penalty=1.0,
                                 max_length=64)[0].tolist()
            outputs.append([t for t in ids[1:] if t not in (model.config.eos_token_id,
                                                           model.config.pad_token_id)])
    return outputs


def ours(bundle: Path, variant: str, beam: int) -> list[list[int]]:
    engine = Engine(bundle, threads=1, variant=variant)
    translations = engine.translate(SOURCES, beam_size=beam, length_penalty=1.0,
                                    target_lang="deu")
    return [t.hypotheses[0].token_ids for t in translations]


def test_marian_greedy_is_exactly_transformers(marian_dir: Path, marian_bundle: Path) -> None:
    expected = reference(marian_dir, beam=1)
    assert ours(marian_bundle, "fp32", 1) == expected
    # Static int8 moves the numbers a little; it still reproduces (nearly) every sentence.
    int8 = ours(marian_bundle, "int8", 1)
    assert sum(a == b for a, b in zip(int8, expected, strict=True)) >= 0.9 * len(expected)
    # So do the fp16 graphs (for CUDA; here on the CPU provider) of an imported model, with
    # swish and a logits bias: 64 of 64 on an AMD EPYC.
    fp16 = ours(marian_bundle, "fp16", 1)
    assert sum(a == b for a, b in zip(fp16, expected, strict=True)) >= 0.9 * len(expected)


def test_marian_beam_search_matches_transformers(marian_dir: Path, marian_bundle: Path) -> None:
    expected = reference(marian_dir, beam=4)
    got = ours(marian_bundle, "fp32", 4)
    assert sum(a == b for a, b in zip(got, expected, strict=True)) >= 0.9 * len(expected)


def test_a_multilingual_marian_bundle_serves_a_pair_per_target(marian_dir: Path,
                                                               marian_bundle: Path) -> None:
    from transformers import MarianTokenizer

    bundle = load_bundle(marian_bundle)
    assert bundle.manifest["target_languages"] == {"deu": ">>deu<<", "ltz": ">>ltz<<"}
    assert bundle.pairs == [("en", "deu"), ("en", "ltz")]
    manifest = bundle.manifest
    assert manifest["model"]["activation"] == "swish"
    assert manifest["model"]["position_layout"] == "halves"
    assert manifest["model"]["output_bias"] is True
    assert manifest["special_ids"]["bos"] == manifest["special_ids"]["pad"]  # Marian's start
    engine = Engine(marian_bundle, threads=1)
    tokenizer = MarianTokenizer.from_pretrained(marian_dir)
    for lang, token in bundle.manifest["target_languages"].items():
        text = "Where is the train station?"
        assert engine.tokenize(text, lang) == tokenizer([f"{token} {text}"])["input_ids"][0]
    with pytest.raises(ValueError, match="target language 'fra'"):
        engine.tokenize("Hello.", "fra")
    assert engine.translate(["Where is the train station?"], target_lang="deu")[0].text == (
        "Wo ist der Bahnhof?")


def test_unsupported_models_are_refused_by_name(marian_dir: Path, tmp_path: Path) -> None:
    import shutil

    with pytest.raises(UnsupportedModel, match="not a recognised model"):
        import_model(tmp_path, tmp_path / "out")
    changed = tmp_path / "tanh"
    shutil.copytree(marian_dir, changed)
    config = json.loads((changed / "config.json").read_text())
    config["activation_function"] = "tanh"
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match="the activation 'tanh'"):
        import_model(changed, tmp_path / "out")
    config.update(activation_function="swish", normalize_embedding=True)
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match="a layer norm on the embeddings"):
        import_model(changed, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- CTranslate2 and Argos Translate --------------------------------------------------------------


@pytest.fixture(scope="module")
def ct2_dir(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Marian fixture converted by ctranslate2's own converter, with its SentencePiece
    models beside it (as a user keeps them)."""
    import shutil

    from ctranslate2.converters import TransformersConverter

    out = tmp_path_factory.mktemp("ct2") / "model"
    TransformersConverter(str(marian_dir)).convert(str(out))
    for name in ("source.spm", "target.spm"):
        shutil.copy(marian_dir / name, out / name)
    return out


def ctranslate2_greedy(model_dir: Path, sources: list[list[str]], **kwargs) -> list[list[str]]:
    import ctranslate2

    translator = ctranslate2.Translator(str(model_dir), device="cpu", **kwargs)
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=64)
    return [result.hypotheses[0] for result in results]


def marian_pieces(marian_dir: Path) -> list[list[str]]:
    """The fixture's sources as CTranslate2 takes them: pieces, language token first."""
    from transformers import MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(marian_dir)
    return [tokenizer.convert_ids_to_tokens(tokenizer([f"{GERMAN} {s}"])["input_ids"][0])
            for s in SOURCES]


def our_pieces(bundle: Path) -> list[list[str]]:
    engine = Engine(bundle, threads=1, variant="fp32")
    return [t.hypotheses[0].tokens
            for t in engine.translate(SOURCES, beam_size=1, target_lang="deu")]


@pytest.mark.parametrize("quantization", [None, "float16", "bfloat16", "int8", "int16"])
def test_ctranslate2_import_is_exactly_ctranslate2(marian_dir: Path, ct2_dir: Path,
                                                   tmp_path: Path, quantization) -> None:
    from ctranslate2.converters import TransformersConverter

    model = ct2_dir
    if quantization:  # the same model stored with 16- or 8-bit weights (int16 with scales)
        model = tmp_path / "quantized"
        TransformersConverter(str(marian_dir)).convert(str(model), quantization=quantization)
        for name in ("source.spm", "target.spm"):
            (model / name).write_bytes((ct2_dir / name).read_bytes())
    bundle = import_model(model, tmp_path / "en-de", source_lang="en", target_lang="de")
    manifest = load_bundle(bundle).manifest
    assert manifest["imported_from"]["format"] == "ctranslate2"
    assert manifest["target_languages"] == {"deu": ">>deu<<", "ltz": ">>ltz<<"}
    # Our weights are the stored ones in float32: CTranslate2 computing in float32 on them.
    expected = ctranslate2_greedy(model, marian_pieces(marian_dir), compute_type="float32")
    got = our_pieces(bundle)
    assert got == expected
    if quantization is None:  # and transformers agrees: the converter kept the model
        engine = Engine(bundle, threads=1)
        assert got == [[engine.vocabulary.piece(t) for t in ids]
                       for ids in reference(marian_dir, beam=1)]


def test_an_argos_package_imports_with_its_languages(marian_dir: Path, ct2_dir: Path,
                                                     tmp_path: Path) -> None:
    import shutil
    import zipfile

    package = tmp_path / "translate-en_de-1_0"
    shutil.copytree(ct2_dir, package / "model")
    shutil.move(package / "model" / "source.spm", package / "sentencepiece.model")
    (package / "model" / "target.spm").unlink()
    (package / "metadata.json").write_text(json.dumps(
        {"package_version": "1.0", "from_code": "en", "to_code": "de"}))
    archive = tmp_path / "translate-en_de-1_0.argosmodel"
    with zipfile.ZipFile(archive, "w") as zipped:
        for file in package.rglob("*"):
            zipped.write(file, file.relative_to(tmp_path))
    expected = ctranslate2_greedy(ct2_dir, marian_pieces(marian_dir))
    for source in (package, archive):
        bundle = import_model(source, tmp_path / "out" / source.name)
        manifest = load_bundle(bundle).manifest
        assert (manifest["source_lang"], manifest["target_lang"]) == ("en", "de")
        assert manifest["imported_from"]["format"] == "argos"
        assert our_pieces(bundle) == expected


def opennmt_model(marian_dir: Path, out: Path, heads: int = 4, add_bos: bool = False,
                  add_eos: bool = False, max_relative: int = 0, unk_last: bool = False,
                  ) -> Path:
    """An OpenNMT-style model (pre-norm, ReLU, CTranslate2's built-in sinusoids, <blank>
    padding, <s> start, shared embeddings) written through ctranslate2's spec API with random
    weights, and the source conventions its config.json names, with the fixture's
    SentencePiece model beside it."""
    import numpy as np
    import sentencepiece as spm
    from ctranslate2.specs import common_spec, transformer_spec

    tokenizer = spm.SentencePieceProcessor(model_file=str(marian_dir / "source.spm"))
    pieces = ["<blank>", "<unk>", "<s>", "</s>"] + [
        tokenizer.id_to_piece(i) for i in range(tokenizer.get_piece_size())
        if not tokenizer.is_control(i) and not tokenizer.is_unknown(i)]
    if unk_last:  # where CTranslate2 puts it when the vocabulary file lacks it
        pieces.remove("<unk>")
        pieces.append("<unk>")
    d, vocab, rng = 64, len(pieces), np.random.default_rng(0)

    def fill(linear, rows: int, columns: int, scale: float = 0.2) -> None:
        linear.weight = rng.normal(0, scale, (rows, columns)).astype(np.float32)
        linear.bias = rng.normal(0, scale, rows).astype(np.float32)

    def norm(layer_norm) -> None:
        layer_norm.gamma = (1 + rng.normal(0, 0.1, d)).astype(np.float32)
        layer_norm.beta = rng.normal(0, 0.1, d).astype(np.float32)

    spec = transformer_spec.TransformerSpec.from_config(
        2, heads, pre_norm=True, activation=common_spec.Activation.RELU,
        with_relative_position=bool(max_relative))
    if max_relative:  # OpenNMT-py's max_relative_positions: a key and value table per layer
        for layer in [*spec.encoder.layer, *spec.decoder.layer]:
            for table in ("relative_position_keys", "relative_position_values"):
                setattr(layer.self_attention, table, rng.normal(
                    0, 0.5, (2 * max_relative + 1, d // heads)).astype(np.float32))
    embeddings = rng.normal(0, 0.3, (vocab, d)).astype(np.float32)
    spec.encoder.embeddings[0].weight = embeddings
    spec.decoder.embeddings.weight = embeddings
    for layer in spec.encoder.layer:
        fill(layer.self_attention.linear[0], 3 * d, d)
        fill(layer.self_attention.linear[1], d, d)
        fill(layer.ffn.linear_0, 2 * d, d)
        fill(layer.ffn.linear_1, d, 2 * d)
        norm(layer.self_attention.layer_norm)
        norm(layer.ffn.layer_norm)
    for layer in spec.decoder.layer:
        fill(layer.self_attention.linear[0], 3 * d, d)
        fill(layer.self_attention.linear[1], d, d)
        fill(layer.attention.linear[0], d, d)
        fill(layer.attention.linear[1], 2 * d, d)
        fill(layer.attention.linear[2], d, d)
        fill(layer.ffn.linear_0, 2 * d, d)
        fill(layer.ffn.linear_1, d, 2 * d)
        for layer_norm in (layer.self_attention.layer_norm, layer.attention.layer_norm,
                           layer.ffn.layer_norm):
            norm(layer_norm)
    norm(spec.encoder.layer_norm)
    norm(spec.decoder.layer_norm)
    fill(spec.decoder.projection, vocab, d, scale=1.0)  # peaked: no near-ties in the argmax
    # As after training: padding and the start token are never predicted (our decoder never
    # emits them; CTranslate2 would, on a model that predicts them).
    spec.decoder.projection.bias[[pieces.index("<blank>"), pieces.index("<s>")]] = -100.0
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.bos_token, spec.config.eos_token = "<s>", "</s>"
    spec.config.decoder_start_token, spec.config.unk_token = "<s>", "<unk>"
    spec.config.add_source_bos, spec.config.add_source_eos = add_bos, add_eos
    spec.validate()
    spec.optimize()
    out.mkdir(parents=True)
    spec.save(str(out))
    (out / "sentencepiece.model").write_bytes((marian_dir / "source.spm").read_bytes())
    return out


def matches_ctranslate2(model_dir: Path, bundle: Path, beams: tuple[int, ...] = (1, 4),
                        ) -> dict[int, int]:
    """{beam: sentences whose tokens equal ctranslate2's on ``model_dir``}: CTranslate2 given
    the pieces alone, as Argos Translate gives them (it adds what the model's config names)."""
    import ctranslate2
    import sentencepiece as spm

    tokenizer = spm.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.model"))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type="float32")
    sources = [tokenizer.encode(s, out_type=str) for s in SOURCES]
    engine = Engine(bundle, threads=1, variant="fp32")
    found = {}
    for beam in beams:
        expected = [r.hypotheses[0] for r in translator.translate_batch(
            sources, beam_size=beam, max_decoding_length=20)]
        got = [t.hypotheses[0].tokens for t in engine.translate(
            SOURCES, beam_size=beam, max_length=20, length_penalty=1.0)]
        found[beam] = sum(a == b for a, b in zip(got, expected, strict=True))
    return found


@pytest.mark.parametrize(("add_bos", "add_eos", "heads", "max_relative"), [
    (False, False, 4, 0),  # OpenNMT-py, as Argos Translate (and LibreTranslate) ship models
    (True, True, 4, 0),  # OpenNMT-tf with both marks
    (False, True, 4, 0),
    # A head size of 4: onnxruntime's fused attention takes multiples of 8 only, so the
    # decoder's attention is exported in plain operators.
    (False, False, 16, 0),
    # Relative position representations (Shaw et al.), clipped at 4, as OpenNMT-py trains them
    # with max_relative_positions; with fused-size heads and with a head size of 4.
    (False, False, 4, 4),
    (False, False, 16, 4),
])
def test_a_pre_norm_opennmt_style_model_translates_as_ctranslate2_does(
        marian_dir: Path, tmp_path: Path, add_bos: bool, add_eos: bool, heads: int,
        max_relative: int) -> None:
    model_dir = opennmt_model(marian_dir, tmp_path / "opennmt", heads=heads, add_bos=add_bos,
                              add_eos=add_eos, max_relative=max_relative)
    bundle = import_model(model_dir, tmp_path / "en-de", source_lang="en", target_lang="de")
    manifest = load_bundle(bundle).manifest
    assert manifest["model"]["pre_norm"] is True and manifest["model"]["tie_output"] is False
    assert (manifest["model"]["position_layout"], manifest["model"]["position_offset"]) == (
        "tensor2tensor", 1)
    assert manifest["model"]["max_relative_positions"] == max_relative
    assert manifest["source_format"] == {"add_bos": add_bos, "add_eos": add_eos}
    found = matches_ctranslate2(model_dir, bundle)
    # Greedy: every token id. Beam 4: equal where no two hypotheses' scores tie within float
    # rounding (the engines sum log-probabilities in different orders).
    assert found[1] == len(SOURCES) and found[4] >= 0.95 * len(SOURCES), found


@pytest.mark.parametrize(("version", "revision", "spec", "int16"), [
    (1, 1, "", False),  # OpenNMT-tf's names, no spec name, no aliases, item widths
    (2, 2, "TransformerBase", False),  # heads from the spec's name
    (3, 3, "TransformerSpec", False),  # aliases; one flag for both stacks
    (4, 4, "TransformerSpec", False),  # type ids
    (5, 5, "TransformerSpec", False),  # per-stack flags; conventions still in model.bin
    (5, 5, "TransformerSpec", True),  # int16 weights without stored scales
])
def test_every_binary_version_ctranslate2_loads_imports_as_it_reads_it(
        marian_dir: Path, tmp_path: Path, version: int, revision: int, spec: str,
        int16: bool) -> None:
    from tests.ct2_formats import older_layout

    current = opennmt_model(marian_dir, tmp_path / "current", heads=8, add_eos=True)
    model_dir = older_layout(current, tmp_path / "older", version, revision, spec,
                             int16_without_scales=int16)
    bundle = import_model(model_dir, tmp_path / "en-de", source_lang="en", target_lang="de")
    assert load_bundle(bundle).manifest["source_format"] == {"add_bos": False,
                                                              "add_eos": True}
    found = matches_ctranslate2(model_dir, bundle, beams=(1,))
    assert found[1] == len(SOURCES), found


def test_a_vocabulary_without_the_unknown_token_gets_it_last_as_ctranslate2_adds_it(
        marian_dir: Path, tmp_path: Path) -> None:
    """A binary-version-2 model whose vocabulary file lacks <unk>, its embeddings holding
    the row CTranslate2 gives the token it appends."""
    from tests.ct2_formats import older_layout

    current = opennmt_model(marian_dir, tmp_path / "current", heads=8, unk_last=True)
    model_dir = older_layout(current, tmp_path / "older", 2, 2, "TransformerBase")
    pieces = json.loads((model_dir / "shared_vocabulary.json").read_text())
    assert pieces[-1] == "<unk>"
    (model_dir / "shared_vocabulary.json").unlink()
    (model_dir / "shared_vocabulary.txt").write_text("\n".join(pieces[:-1]) + "\n")
    bundle = import_model(model_dir, tmp_path / "en-de", source_lang="en", target_lang="de")
    assert load_bundle(bundle).manifest["model"]["unk_id"] == len(pieces) - 1
    # The same model with the token in its file, which imported before this change.
    listed = import_model(current, tmp_path / "listed", source_lang="en", target_lang="de")

    def greedy(imported: Path) -> list[list[str]]:
        engine = Engine(imported, threads=1, variant="fp32")
        return [t.hypotheses[0].tokens for t in engine.translate(
            SOURCES, beam_size=1, max_length=20, length_penalty=1.0)]

    assert greedy(bundle) == greedy(listed)
    # And CTranslate2's greedy tokens, reading the file without the token. On one sentence of
    # this random model (29) the end token is the first step's best (log-prob -0.84 against
    # -1.09): our engine ends there, with an empty translation, where CTranslate2's
    # min_decoding_length (1 by default) makes it take the next best. Not the vocabulary's
    # doing: the same with <unk> listed in the file.
    found = matches_ctranslate2(model_dir, bundle, beams=(1,))
    assert found[1] >= len(SOURCES) - 1, found


@pytest.mark.parametrize(("files", "metadata", "refusal"), [
    (["bpe.model"], {}, "tokenized with BPE"),
    (["sentencepiece.model"], {"type": "sbd"}, "an Argos 'sbd' package"),
])
def test_argos_packages_this_service_cannot_tokenize_are_refused_by_name(
        tmp_path: Path, files: list[str], metadata: dict, refusal: str) -> None:
    package = tmp_path / "translate-en_de-1_9"
    (package / "model").mkdir(parents=True)
    (package / "model" / "model.bin").write_bytes(b"")
    for name in files:
        (package / name).write_bytes(b"")
    (package / "metadata.json").write_text(json.dumps(
        {"package_version": "1.9", "argos_version": "1.9.0", "from_code": "en",
         "to_code": "de", **metadata}))
    with pytest.raises(UnsupportedModel, match=refusal):
        import_model(package, tmp_path / "en-de")


def test_the_service_serves_an_imported_multilingual_bundle_beside_others(
        marian_bundle: Path, tiny_bundle: Path, tmp_path: Path) -> None:
    import asyncio
    import shutil

    from service.main import create_app
    from service.settings import Settings
    from tests.test_api import serving

    models = tmp_path / "models"
    shutil.copytree(marian_bundle, models / "opus-mt-en-mul")
    shutil.copytree(tiny_bundle, models / "en-de")

    async def main() -> None:
        async with serving(create_app(Settings(model_dir=models, workers=1))) as client:
            pairs = (await client.get("/languages")).json()["pairs"]
            assert [(p["source_lang"], p["target_lang"], p["model"]) for p in pairs] == [
                ("en", "de", "en-de"), ("en", "deu", "opus-mt-en-mul"),
                ("en", "ltz", "opus-mt-en-mul")]
            response = await client.post("/translate", json={
                "text": "Where is the train station? The cat is sleeping on the sofa.",
                "target_lang": "deu", "beam_size": 1})
            assert response.status_code == 200, response.text
            assert response.json()["translations"][0]["text"] == (
                "Wo ist der Bahnhof? Die Katze schläft auf dem Sofa.")

    asyncio.run(main())


def test_two_imported_models_serve_the_pair_between_them_through_english(
        marian_dir: Path, marian_bundle: Path, tmp_path: Path) -> None:
    """An Argos-style model imported as fr->en and the imported Opus-MT-style en->mul: fr->deu
    is served in two legs, exactly as translating twice by hand, untranslatables through
    both, and each leg's sentences cached under that leg's own pair and model."""
    import shutil

    from service.translator import Translator

    models = tmp_path / "models"
    import_model(opennmt_model(marian_dir, tmp_path / "opennmt"), models / "fr-en",
                 source_lang="fr", target_lang="en")
    shutil.copytree(marian_bundle, models / "en-mul")
    source = SOURCES[3] + " https://example.org/a"
    with Translator.open(models, device="cpu", threads=1, workers=1) as translator:
        assert translator.pivots[("fr", "deu")] == "en"
        middle = translator.translate_batch([source], ("fr", "en"))[0].text
        by_hand = translator.translate_batch([middle], ("en", "deu"))[0].text
        pivoted = translator.translate_batch([source], ("fr", "deu"))[0].text
        assert pivoted == by_hand
        assert pivoted.count("https://example.org/a") == 1
        # Both legs were decoded before: translating again is answered by the cache, one
        # hit a leg (the sentence, then its English).
        hits = translator.cache.hits
        assert translator.translate_batch([source], ("fr", "deu"))[0].text == pivoted
        assert translator.cache.hits == hits + 2
