"""``translate-models`` against a loopback mirror (tests/model_mirror.py): an Argos index with
packages built here from the tiny MarianMT fixture converted by CTranslate2, and a hub that
``huggingface_hub`` downloads the same model's repository from."""

from __future__ import annotations

import io
import json
import shutil
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from tests.model_mirror import COMMIT, Mirror, MirrorServer, repo_files
from tests.test_api import free_port
from tests.test_importers import (
    ct2_dir,  # noqa: F401  (a fixture this module uses too)
    opennmt_model,
)
from training.catalogue.cli import main

PACKAGE = "translate-en_de-1_1.argosmodel"
REPO = "Helsinki-NLP/opus-mt-en-de"


def argos_package(ct2_model: Path, metadata: dict, tokenizer: str = "sentencepiece.model",
                  ) -> bytes:
    """An ``.argosmodel`` as Argos Translate packs one: a folder holding metadata.json, the
    tokenizer (``sentencepiece.model``, or Argos 1.9's ``bpe.model``), a Stanza sentence
    splitter and the CTranslate2 model in model/."""
    buffer = io.BytesIO()
    root = "translate-en_de-1_1"
    with zipfile.ZipFile(buffer, "w") as archive:
        for file in ct2_model.iterdir():
            if file.suffix != ".spm" and file.name != "sentencepiece.model":
                archive.write(file, f"{root}/model/{file.name}")
        if tokenizer == "bpe.model":  # subword-nmt's merges, as such packages hold them
            archive.writestr(f"{root}/bpe.model", "#version: 0.2\nt h\nth e</w>\n")
        else:
            spm = next(p for p in (ct2_model / "source.spm", ct2_model / "sentencepiece.model")
                       if p.is_file())
            archive.write(spm, f"{root}/{tokenizer}")
        archive.writestr(f"{root}/metadata.json", json.dumps(metadata))
        archive.writestr(f"{root}/stanza/en/tokenize/en.pt", b"a sentence splitter")
    return buffer.getvalue()


def entry(mirror: Mirror, name: str, source: str, target: str, version: str) -> dict:
    return {"code": f"translate-{source}_{target}", "type": "translate", "from_code": source,
            "to_code": target, "package_version": version, "argos_version": "1.0",
            "from_name": source, "to_name": target, "links": [mirror.package_url(name)]}


@pytest.fixture(scope="module")
def packages(ct2_dir: Path) -> dict[str, bytes]:  # noqa: F811
    metadata = {"package_version": "1.1", "argos_version": "1.9.6", "from_code": "en",
                "to_code": "de", "type": "translate"}
    return {
        "translate-en_de-1_0.argosmodel": argos_package(ct2_dir, {**metadata,
                                                                  "package_version": "1.0"}),
        PACKAGE: argos_package(ct2_dir, metadata),
        # A BPE package (Argos 1.9's bpe.model instead of SentencePiece): refused by name.
        "translate-de_en-1_9.argosmodel": argos_package(
            ct2_dir, {**metadata, "from_code": "de", "to_code": "en"}, "bpe.model"),
    }


@pytest.fixture
def mirror(packages: dict[str, bytes], marian_dir: Path, monkeypatch: pytest.MonkeyPatch,
           tmp_path: Path):
    with MirrorServer(Mirror(packages=dict(packages))) as served:
        served.index = [
            entry(served, "translate-en_de-1_0.argosmodel", "en", "de", "1.0"),
            entry(served, PACKAGE, "en", "de", "1.1"),
            entry(served, "translate-de_en-1_9.argosmodel", "de", "en", "1.9"),
        ]
        served.repos[REPO] = repo_files(marian_dir)
        monkeypatch.setenv("ARGOS_PACKAGE_INDEX", served.index_url())
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("MODELS", raising=False)
        # No service there: ``list`` says so (one on this machine's port 8000 is not ours).
        monkeypatch.setenv("TRANSLATE_SERVICE_URL", f"http://127.0.0.1:{free_port()}")
        yield served


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    status = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def failure(err: str) -> str:
    """The one line a failure prints (progress lines come before it)."""
    (line,) = [line for line in err.splitlines() if line.startswith("translate-models:")]
    return line


def package_gets(mirror: Mirror, name: str = PACKAGE) -> list[str | None]:
    return [ranged for method, path, ranged in mirror.requests
            if method == "GET" and path == f"/packages/{name}"]


def test_available_lists_every_argos_version_and_the_hub_repositories(
        mirror: Mirror, capsys: pytest.CaptureFixture) -> None:
    status, out, _ = run(capsys, "available")
    assert status == 0
    lines = [line.split("\t")[:3] for line in out.splitlines()]
    assert ["en-de", "argos", "1.0"] in lines and ["en-de", "argos", "1.1"] in lines
    assert ["de-en", "argos", "1.9"] in lines and ["en-de", "opus-mt", REPO] in lines


def test_install_list_remove_an_argos_package(mirror: Mirror, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    models = tmp_path / "models"
    status, out, err = run(capsys, "--model-dir", models, "install", "en-de", "--source",
                           "argos", "--cache-dir", tmp_path / "cache")
    assert status == 0, err
    assert out.startswith("en-de\targos\t1.1\t")  # the newest version the index lists
    origin = json.loads((models / "en-de" / "installed.json").read_text())
    assert origin["url"] == mirror.package_url(PACKAGE)
    assert origin["probe"]["translation"].strip()
    manifest = json.loads((models / "en-de" / "manifest.json").read_text())
    assert manifest["default_variant"] == "int8"
    assert manifest["imported_from"]["not_imported"] == ["stanza (sentence splitting)"]
    assert not [p for p in models.iterdir() if p.name.startswith(".installing")]

    status, out, err = run(capsys, "--model-dir", models, "list")
    pair, source, version, size, loaded, path = out.strip().split("\t")
    assert (pair, source, version, loaded, path) == ("en-de", "argos", "1.1", "-",
                                                     str(models / "en-de"))
    assert float(size.split()[0]) > 0
    assert status == 0 and failure(err).startswith("translate-models: no service answers at")

    status, out, err = run(capsys, "--model-dir", models, "install", "de-en", "--source",
                           "argos", "--cache-dir", tmp_path / "cache")
    assert status == 1
    err = failure(err)
    assert "de-en" in err and "translate-de_en-1_9" in err and "BPE" in err
    assert not (models / "de-en").exists()

    assert run(capsys, "--model-dir", models, "remove", "en-de")[0] == 0
    assert not (models / "en-de").exists()
    assert run(capsys, "--model-dir", models, "list")[1] == ""


def test_a_cut_download_resumes_where_it_stopped(mirror: Mirror, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    mirror.cut_next.add(PACKAGE)
    status, _, err = run(capsys, "--model-dir", tmp_path / "models", "install", "en-de",
                         "--cache-dir", tmp_path / "cache")
    assert status == 0, err
    half = len(mirror.packages[PACKAGE]) // 2
    assert package_gets(mirror) == [None, f"bytes={half}-"]


def test_a_corrupt_download_is_refused_and_not_kept(mirror: Mirror, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    mirror.corrupt.add(PACKAGE)
    models, cache = tmp_path / "models", tmp_path / "cache"
    status, _, err = run(capsys, "--model-dir", models, "install", "en-de", "--source", "argos",
                         "--cache-dir", cache)
    assert status == 1
    err = failure(err)
    assert "en-de" in err and mirror.package_url(PACKAGE) in err and "corrupt" in err
    assert not (models / "en-de").exists() and not list(cache.rglob("*.argosmodel*"))
    mirror.corrupt.clear()  # the mirror mended: the next install downloads it whole
    assert run(capsys, "--model-dir", models, "install", "en-de", "--source", "argos",
               "--cache-dir", cache)[0] == 0


def test_offline_says_so_in_one_line(mirror: Mirror, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture) -> None:
    closed = "http://127.0.0.1:9/index.json"  # the discard port: nothing listens
    monkeypatch.setenv("ARGOS_PACKAGE_INDEX", closed)
    status, _, err = run(capsys, "--model-dir", tmp_path / "models", "install", "en-de",
                         "--source", "argos")
    assert status == 1
    err = failure(err)
    assert "en-de" in err and "offline" in err and closed in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    status, _, err = run(capsys, "--model-dir", tmp_path / "models", "install", "en-de",
                         "--source", "opus-mt")
    assert status == 1
    err = failure(err)
    assert "en-de" in err and "offline" in err and REPO in err


def test_opus_mt_from_the_hub_then_offline_from_its_cache(mirror: Mirror, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    models = tmp_path / "models"
    status, out, err = run(capsys, "--model-dir", models, "install", "en-de", "--source",
                           "opus-mt")
    assert status == 0, err
    assert out.startswith(f"en-de\topus-mt\t{COMMIT[:12]}\t")
    manifest = json.loads((models / "en-de" / "manifest.json").read_text())
    assert manifest["imported_from"]["format"] == "huggingface-marian"
    downloads = [path for method, path, _ in mirror.requests if method == "GET"
                 and "/resolve/" in path]
    assert any(path.endswith("model.safetensors") for path in downloads)

    shutil.rmtree(models)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(mirror.requests)
    status, out, err = run(capsys, "--model-dir", models, "install", "en-de", "--source",
                           "opus-mt")
    assert status == 0, err
    assert len(mirror.requests) == before  # the hub's cache, not the network


def test_a_corrupt_hub_file_is_refused(mirror: Mirror, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    mirror.corrupt.add("model.safetensors")
    status, _, err = run(capsys, "--model-dir", tmp_path / "models", "install", "en-de",
                         "--source", "opus-mt")
    assert status == 1
    err = failure(err)
    assert "model.safetensors" in err and ("corrupt" in err or "SHA" in err), err
    assert not (tmp_path / "models" / "en-de").exists()


def test_two_installs_of_one_pair_download_and_import_it_once(
        mirror: Mirror, tmp_path: Path) -> None:
    from training.catalogue.install import install

    models, results, errors = tmp_path / "models", [], []

    def one() -> None:
        try:
            results.append(install("en-de", models, "argos", cache_dir=tmp_path / "cache"))
        except Exception as error:  # reported below: a thread's exception is otherwise lost
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert [found.pair for found in results] == ["en-de", "en-de"]
    assert package_gets(mirror) == [None]
    assert sorted(p.name for p in models.iterdir() if not p.name.startswith(".")) == ["en-de"]


def test_the_service_installs_what_models_names_before_it_reports_ready(
        mirror: Mirror, tmp_path: Path) -> None:
    import asyncio

    from service.main import create_app
    from service.settings import Settings
    from tests.test_api import serving, wait_ready

    models = tmp_path / "models"
    refused = create_app(Settings(model_dir=models, models=["en-de"], workers=1, threads=1))

    async def refuses() -> None:
        async with serving(refused, wait=False) as client:
            while (await client.get("/ready")).json()["error"]["code"] == "not_ready":
                await asyncio.sleep(0.01)
        state = refused.state.service
        assert state.phase == "failed"
        assert f"translate-models --model-dir {models} install en-de" in state.error

    asyncio.run(refuses())
    assert package_gets(mirror) == []

    app = create_app(Settings(model_dir=models, models=["en-de"], install_models=True,
                              workers=1, threads=1))

    async def installs() -> None:
        async with serving(app, wait=False) as client:
            await wait_ready(client, timeout=600)
            response = await client.post("/translate", json={
                "text": "This is a short test.", "source_lang": "en", "target_lang": "deu"})
            assert response.status_code == 200, response.text

    asyncio.run(installs())
    assert package_gets(mirror) == [None]
    assert json.loads((models / "en-de" / "installed.json").read_text())["source"] == "argos"


def test_an_early_argos_package_without_the_unknown_token_installs(
        mirror: Mirror, marian_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """As the index's first package versions ship: CTranslate2's binary version 2, the
    vocabulary a text file without <unk> (which CTranslate2 appends)."""
    from tests.ct2_formats import older_layout

    current = opennmt_model(marian_dir, tmp_path / "current", heads=8, unk_last=True)
    model = older_layout(current, tmp_path / "older", 2, 2, "TransformerBase")
    pieces = json.loads((model / "shared_vocabulary.json").read_text())
    (model / "shared_vocabulary.json").unlink()
    (model / "shared_vocabulary.txt").write_text("\n".join(pieces[:-1]) + "\n")
    mirror.packages["translate-en_es-1_0.argosmodel"] = argos_package(model, {
        "package_version": "1.0", "argos_version": "0.1", "from_code": "en", "to_code": "es"})
    mirror.index.append(entry(mirror, "translate-en_es-1_0.argosmodel", "en", "es", "1.0"))
    models = tmp_path / "models"
    status, out, err = run(capsys, "--model-dir", models, "install", "en-es", "--cache-dir",
                           tmp_path / "cache")
    assert status == 0, err
    assert out.startswith("en-es\targos\t1.0\t")
    manifest = json.loads((models / "en-es" / "manifest.json").read_text())
    assert manifest["model"]["unk_id"] == len(pieces) - 1


def test_list_says_which_pairs_a_running_service_has_loaded(
        tiny_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """The real server (``python -m service.main``) over two bundles with a budget, one
    loaded by a request; then the same listing once it has stopped."""
    import httpx

    from tests.test_server import ServerProcess

    models = tmp_path / "models"
    for pair in ("en-de", "fr-en", "es-en"):
        shutil.copytree(tiny_bundle, models / pair)
        manifest = json.loads((models / pair / "manifest.json").read_text())
        manifest.update(source_lang=pair[:2], target_lang=pair[3:])
        (models / pair / "manifest.json").write_text(json.dumps(manifest))
    # es-en is installed but the service leaves it out (MODELS).
    server = ServerProcess([sys.executable, "-m", "service.main", "--model-dir", str(models),
                            "--threads", "1", "--workers", "1"],
                           env={"MODEL_MEMORY_MB": "1000", "MODELS": "en-de,fr-en",
                                "API_KEYS": "sesame"})
    try:
        server.wait_for("/ready")
        response = httpx.post(f"{server.url}/translate", timeout=60, json={
            "text": "Hello.", "source_lang": "fr", "target_lang": "en"},
            headers={"Authorization": "Bearer sesame"})
        assert response.status_code == 200, response.text
        monkeypatch.setenv("TRANSLATE_SERVICE_URL", server.url)
        status, out, err = run(capsys, "--model-dir", models, "list")
        assert status == 0 and "--api-key" in failure(err)  # /metrics needs the key
        status, out, err = run(capsys, "--model-dir", models, "list", "--api-key", "sesame")
        assert status == 0 and err == ""
        listed = {line.split("\t")[0]: line.split("\t")[4] for line in out.splitlines()}
        assert listed == {"en-de": "not loaded", "es-en": "not served", "fr-en": "loaded"}
    finally:
        server.stop()
    status, out, err = run(capsys, "--model-dir", models, "list", "--service", server.url)
    assert status == 0
    assert failure(err) == (f"translate-models: no service answers at {server.url} "
                            "([Errno 111] Connection refused): loaded or not unknown")
    assert [line.split("\t")[4] for line in out.splitlines()] == ["-", "-", "-"]


def without_language_tokens(files: dict[str, bytes]) -> dict[str, bytes]:
    """The MarianMT repository's files with its target-language tokens renamed to plain
    pieces: a model whose sources need no token, as opus-mt-mul-en's."""
    vocab = json.loads(files["vocab.json"])
    renamed = {piece.strip("<>") if piece.startswith(">>") else piece: index
               for piece, index in vocab.items()}
    return {**files, "vocab.json": json.dumps(renamed).encode()}


def test_a_pair_no_bilingual_model_serves_installs_from_a_multilingual_one(
        mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """No opus-mt-en-de on the hub: opus-mt-en-fiu (tokens for Finnish and Estonian only) is
    looked at and passed over, opus-mt-en-gmw (>>deu<<, >>ltz<<) serves en-de alone, its
    sources prefixed with >>deu<< as the service translates them; a source-side group
    (opus-mt-gmw-en) serves a language its card lists and no other."""
    from service.bundle import load_bundle
    from service.translator import Translator

    marian = mirror.repos.pop(REPO)
    fiu = {"vocab.json": json.dumps({"</s>": 0, "<unk>": 1, ">>fin<<": 2, ">>est<<": 3,
                                     "<pad>": 4}).encode(),
           "README.md": b"# en-fiu\n\n* target languages: est,fin\n"}
    mirror.repos.update({
        "Helsinki-NLP/opus-mt-en-gmw": marian,
        "Helsinki-NLP/opus-mt-en-fiu": fiu,
        "Helsinki-NLP/opus-mt-gmw-en": {**without_language_tokens(marian), "README.md": (
            b"# gmw-en\n\n* source group: West Germanic languages\n* target group: English\n"
            b"- source language(s): afr deu ltz nld\n- target language(s): eng\n")},
    })
    models = tmp_path / "models"
    status, out, err = run(capsys, "--model-dir", models, "install", "en-de", "--source",
                           "opus-mt")
    assert status == 0, err
    assert out.startswith(f"en-de\topus-mt\t{COMMIT[:12]}\t")
    assert "opus-mt-en-gmw serves it" in err
    origin = json.loads((models / "en-de" / "installed.json").read_text())
    assert origin["url"] == f"Helsinki-NLP/opus-mt-en-gmw@{COMMIT}"
    assert origin["language_token"] == ">>deu<<"
    bundle = load_bundle(models / "en-de")
    assert bundle.manifest["target_languages"] == {"de": ">>deu<<"}
    assert bundle.pairs == [("en", "de")]
    with Translator.open(models / "en-de", threads=1, workers=1, cache_mb=0) as translator:
        translated = translator.translate_batch(["Where is the train station?"], ("en", "de"))
    assert translated[0].text == "Wo ist der Bahnhof?"  # what >>deu<< asks the model for
    fetched = {path for method, path, _ in mirror.requests if method == "GET"}
    # Its card lists Estonian and Finnish: neither its vocabulary nor its weights are fetched.
    fiu_files = [path.rsplit("/", 1)[1] for path in fetched if "opus-mt-en-fiu/" in path]
    assert fiu_files == ["README.md"]

    status, _, err = run(capsys, "--model-dir", models, "install", "en-fr", "--source",
                         "opus-mt")
    assert status == 1
    assert failure(err) == (
        f"translate-models: en-fr: no Opus-MT model: {mirror.url}/Helsinki-NLP/opus-mt-en-fr "
        "does not exist; the multilingual opus-mt-en-fiu, opus-mt-en-gmw do not cover it")

    status, out, err = run(capsys, "--model-dir", models, "install", "nl-en", "--source",
                           "opus-mt")
    assert status == 0, err
    manifest = load_bundle(models / "nl-en").manifest
    assert (manifest["source_lang"], manifest["target_lang"]) == ("nl", "en")
    assert "target_languages" not in manifest  # no token: the target is the model's only one
    status, _, err = run(capsys, "--model-dir", models, "install", "fr-en", "--source",
                         "opus-mt")
    assert status == 1 and "opus-mt-gmw-en do not cover it" in failure(err)
