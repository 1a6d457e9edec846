"""``translate-train corpus`` (training/recipe.py) on .deb packages built here: no network.

The packages go through the same path as downloaded ones (``PackageSource`` pointed at a folder
of .deb files, ``dpkg-deb`` reading them); DDTP reads Translation files written here.
"""

from __future__ import annotations

import json
import lzma
import shutil
import subprocess
from pathlib import Path

import pytest

from training.cli import main
from training.config import load_config
from training.recipe import (
    PackageSource,
    build_corpus,
    ding_pairs,
    strip_mnemonic,
    strip_mnemonics,
)

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
polib = pytest.importorskip("polib")

ROOT = Path(__file__).resolve().parent.parent

COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: x

Files: *
Copyright: 2024 Someone
License: LGPL-2.1+

Files: debian/*
Copyright: 2024 Someone Else
License: GPL-2+
"""


def _catalog(entries: list[dict], plural_forms: str = "nplurals=2; plural=(n != 1);"):
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Plural-Forms": plural_forms}
    for entry in entries:
        po.append(polib.POEntry(**entry))
    return po


def _deb(folder: Path, package: str, files: dict[str, bytes | str]) -> Path:
    root = folder / f"build-{package}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.0-1\nArchitecture: all\n"
        "Maintainer: Test <test@example.org>\nDescription: test package\n")
    for path, content in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        target.write_bytes(content)
    deb = folder / f"{package}_1.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    shutil.rmtree(root)
    return deb


def _mo(tmp: Path, po) -> bytes:
    path = tmp / "tmp.mo"
    po.save_as_mofile(str(path))
    return path.read_bytes()


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("debs")
    de = _catalog([
        {"msgid": "_Open", "msgstr": "Ö_ffnen"},
        {"msgid": "&Save", "msgstr": "&Speichern"},
        {"msgid": "Tom & Jerry", "msgstr": "Tom & Jerry"},
        {"msgid": "call_back_fn failed", "msgstr": "Fehler in call_fn"},
        {"msgid": "Fish &amp; chips", "msgstr": "Fisch &amp; Pommes"},
        {"msgid": "Close  the\nwindow", "msgstr": "Fenster schließen"},
        {"msgid": "Untranslated", "msgstr": ""},
        {"msgid": "%d file", "msgid_plural": "%d files",
         "msgstr_plural": {0: "%d Datei", 1: "%d Dateien"}},
    ])
    # .po keeps fuzzy entries (msgfmt drops them from .mo): they must be skipped here too.
    de_po = _catalog([
        {"msgid": "Quit", "msgstr": "Beenden"},
        {"msgid": "Fuzzy one", "msgstr": "Unscharf", "flags": ["fuzzy"]},
    ])
    fr = _catalog([
        {"msgid": "_Open", "msgstr": "_Ouvrir"},
        {"msgid": "%d file", "msgid_plural": "%d files",
         "msgstr_plural": {0: "%d fichier", 1: "%d fichiers"}},
    ], "nplurals=2; plural=(n > 1);")
    ru = _catalog([  # three plural forms: only the singular is paired
        {"msgid": "%d file", "msgid_plural": "%d files",
         "msgstr_plural": {0: "%d файл", 1: "%d файла", 2: "%d файлов"}},
    ], "nplurals=3; plural=(n%10==1 ? 0 : 1);")
    iso = _catalog([{"msgid": "Germany", "msgstr": "Deutschland"}])
    _deb(tmp, "app-data", {
        "usr/share/locale/de/LC_MESSAGES/app.mo": _mo(tmp, de),
        "usr/share/locale/de/LC_MESSAGES/iso_3166.mo": _mo(tmp, iso),
        "usr/share/locale/fr/LC_MESSAGES/app.mo": _mo(tmp, fr),
        "usr/share/locale/ru/LC_MESSAGES/app.mo": _mo(tmp, ru),
        "usr/share/games/app/po/de.po": str(de_po),
        "usr/share/doc/app-data/copyright": COPYRIGHT,
    })
    _deb(tmp, "game-data", {
        "usr/share/locale/de_DE/LC_MESSAGES/game.mo": _mo(tmp, _catalog([
            {"msgid": "Hello, traveller!", "msgstr": "Hallo, Reisender!"}])),
        "usr/share/doc/game-data/copyright": "This is free software under the GNU General "
        "Public License, version 2 or later.\n",
    })
    _deb(tmp, "trans-de-en", {
        "usr/share/trans/de-en": (
            "# Version :: test\n"
            "Aal {m} [cook.] | Aal grün; grüner Aal :: eel | boiled eel\n"
            "Geld {n} | Geld wächst nicht auf Bäumen. :: money | Money doesn’t grow on trees.\n"
            "A {n} :: A\n"),
        "usr/share/doc/trans-de-en/copyright": COPYRIGHT.replace("LGPL-2.1+", "GPL-2+"),
    })
    return tmp


@pytest.fixture(scope="module")
def lists(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lists")
    (tmp / "x_main_i18n_Translation-en").write_text(
        "Package: hello\nDescription-md5: 0123\nDescription-en: greet  the world\n"
        " Hello prints a greeting.\n .\n It is an example.\n\n"
        "Package: other\nDescription-md5: 4567\nDescription-en: other tool\n One.\n .\n Two.\n")
    (tmp / "x_main_i18n_Translation-de").write_text(
        "Package: hello\nDescription-md5: 0123\nDescription-de: die Welt grüßen\n"
        " Hello gibt einen Gruß aus.\n .\n Es ist ein Beispiel.\n\n"
        "Package: other\nDescription-md5: 4567\nDescription-de: anderes Werkzeug\n Eins.\n")
    return tmp


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("recipe") / "recipe.toml"
    path.write_text("""
[[sources]]
name = "ding-sentences"
kind = "ding"
part = "sentences"
languages = ["de"]
packages = ["trans-de-en"]

[[sources]]
name = "ding-phrases"
kind = "ding"
part = "phrases"
languages = ["de"]
packages = ["trans-de-en"]

[[sources]]
name = "gettext-software"
kind = "gettext"
exclude = ["iso_"]
licence = "each package's own"
packages = ["app-data", "not-in-the-folder"]

[[sources]]
name = "place-names"
kind = "gettext"
include = ["iso_"]
packages = ["app-data"]

[[sources]]
name = "games-dialogue"
kind = "gettext"
packages = ["game-data"]

[[sources]]
name = "debian-descriptions"
kind = "ddtp"
licence = "Debian DDTP"
""")
    return path


def _pairs(path: Path) -> list[tuple[str, str]]:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f]


def test_mnemonics() -> None:
    assert strip_mnemonic("_Open") == "Open"
    assert strip_mnemonic("Ö_ffnen") == "Öffnen"
    assert strip_mnemonic("&Save") == "Save"
    assert strip_mnemonic("Save && Quit") == "Save & Quit"
    assert strip_mnemonic("Tom & Jerry") == "Tom & Jerry"
    assert strip_mnemonic("Fish &amp; chips") == "Fish &amp; chips"
    assert strip_mnemonic("max_file_size") == "max_file_size"  # two markers: left alone
    # Pairs: only where the English side has one.
    assert strip_mnemonics("E_xit", "_Beenden") == ("Exit", "Beenden")
    assert strip_mnemonics("[find_call] %s", "[find_call] %s") == ("[findcall] %s",) * 2
    assert strip_mnemonics("find_call: %s", "Fehler in find_call") == (
        "findcall: %s", "Fehler in findcall")
    assert strip_mnemonics("max_file_size", "max_dateigröße") == (
        "max_file_size", "max_dateigröße")


def test_ding_parts() -> None:
    text = "Geld {n} | Geld stinkt nicht. :: money | Money doesn’t smell.\n"
    assert list(ding_pairs(text, "phrases")) == [("money", "Geld")]
    assert list(ding_pairs(text, "sentences")) == [("Money doesn’t smell.", "Geld stinkt nicht.")]


def test_corpus_de(debs: Path, lists: Path, recipe: Path, tmp_path: Path) -> None:
    out = tmp_path / "en-de"
    report = build_corpus("de", out, recipe=recipe, debs=debs, lists=lists,
                          cache=tmp_path / "cache")
    by_name = {s["name"]: s for s in report["sources"]}

    software = _pairs(out / "gettext-software.tsv.xz")
    assert ("Open", "Öffnen") in software and ("Save", "Speichern") in software
    assert ("Tom & Jerry", "Tom & Jerry") in software
    assert ("call_back_fn failed", "Fehler in call_fn") in software  # no English mnemonic
    assert ("Fish &amp; chips", "Fisch &amp; Pommes") in software
    assert ("Close the window", "Fenster schließen") in software  # whitespace folded
    assert ("%d file", "%d Datei") in software and ("%d files", "%d Dateien") in software
    assert ("Quit", "Beenden") in software  # from the .po
    sources = {src for src, _ in software}
    assert "Fuzzy one" not in sources and "Untranslated" not in sources
    assert "Germany" not in sources  # iso_* left out
    assert not any("ouvrir" in tgt.lower() for _, tgt in software)
    assert len(software) == len(set(software)) == 9

    assert _pairs(out / "place-names.tsv.xz") == [("Germany", "Deutschland")]  # iso_* only
    assert _pairs(out / "games-dialogue.tsv.xz") == [("Hello, traveller!", "Hallo, Reisender!")]
    assert _pairs(out / "ding-phrases.tsv.xz") == [
        ("eel", "Aal"), ("boiled eel", "Aal grün"), ("money", "Geld")]  # "A"="A" dropped
    assert _pairs(out / "ding-sentences.tsv.xz") == [
        ("Money doesn’t grow on trees.", "Geld wächst nicht auf Bäumen.")]
    assert _pairs(out / "debian-descriptions.tsv.xz") == [
        ("greet the world", "die Welt grüßen"),
        ("Hello prints a greeting.", "Hello gibt einen Gruß aus."),
        ("It is an example.", "Es ist ein Beispiel."),
        ("other tool", "anderes Werkzeug")]  # 2 paragraphs against 1: not paired

    # Licences: the copyright file's "Files: *" licence, else the families it names.
    assert by_name["gettext-software"]["licence"] == "LGPL-2.1+"
    assert by_name["games-dialogue"]["licence"] == "GPL"
    assert by_name["ding-phrases"]["licence"] == "GPL-2+"
    assert by_name["debian-descriptions"]["licence"] == "Debian DDTP"
    app = by_name["gettext-software"]["packages"]
    assert app[0]["package"] == "app-data" and app[0]["version"] == "1.0-1"
    assert app[1] == {"package": "not-in-the-folder", "missing": True}
    assert by_name["gettext-software"]["pairs"] == 9
    assert report["total"] == 9 + 1 + 1 + 3 + 1 + 4

    saved = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert saved["target_lang"] == "de" and saved["total"] == report["total"]
    provenance = (out / "PROVENANCE.md").read_text(encoding="utf-8")
    assert "| gettext-software.tsv.xz | 9 |" in provenance and "LGPL-2.1+" in provenance


def test_corpus_second_language(debs: Path, recipe: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "en-fr"
    main(["corpus", "--target", "fr", "--out", str(out), "--recipe", str(recipe),
          "--debs", str(debs), "--lists", str(tmp_path / "no-lists"),
          "--cache", str(tmp_path / "cache")])
    printed = capsys.readouterr().out
    assert sorted(_pairs(out / "gettext-software.tsv.xz")) == [  # .mo entries come sorted
        ("%d file", "%d fichier"), ("%d files", "%d fichiers"), ("Open", "Ouvrir")]
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    by_name = {s["name"]: s for s in report["sources"]}
    assert by_name["ding-sentences"]["skipped"] == "holds de only, not fr"
    assert by_name["games-dialogue"]["skipped"].startswith("no fr pairs")
    assert "Translation-fr" in by_name["debian-descriptions"]["skipped"]
    assert not (out / "ding-phrases.tsv.xz").exists()
    assert "gettext-software" in printed and "skipped: holds de only" in printed

    # Three plural forms: the singular only.
    report = build_corpus("ru", tmp_path / "en-ru", recipe=recipe, debs=debs,
                          lists=tmp_path / "no-lists", sources=["gettext-software"])
    assert _pairs(tmp_path / "en-ru" / "gettext-software.tsv.xz") == [("%d file", "%d файл")]


def test_package_source_downloads_into_cache(debs: Path, tmp_path: Path) -> None:
    calls = []

    def download(package: str, folder: Path) -> None:
        calls.append(package)
        shutil.copy(debs / f"{package}_1.0-1_all.deb", folder)

    packages = PackageSource(tmp_path / "cache", download=download)
    first = packages.find("game-data")
    assert first is not None and first.parent == tmp_path / "cache"
    assert packages.find("game-data") == first and calls == ["game-data"]  # cached


def test_rebuilt_config_reads_the_rebuilt_files() -> None:
    config = load_config(ROOT / "configs" / "en-de-rebuilt.toml")
    paths = [s.path for s in config.data.sources]
    assert paths and all(p.startswith("runs/corpus/en-de/") for p in paths)
    assert config.data.target_lang == "de" and config.data.out_dir != "runs/en-de/data"


def test_shipped_recipes_and_the_rebuilt_config_agree() -> None:
    from training.recipe import DEFAULT_RECIPE, RECIPES, load_recipe

    for path in sorted(RECIPES.glob("*.toml")):
        specs = load_recipe(path)
        names = [s.name for s in specs]
        assert specs and len(names) == len(set(names)), path
        assert all(s.packages or s.kind == "ddtp" for s in specs), path
    made = {s.name for s in load_recipe(DEFAULT_RECIPE)}
    config = load_config(ROOT / "configs" / "en-de-rebuilt.toml")
    assert {Path(s.path).name.removesuffix(".tsv.xz") for s in config.data.sources} <= made


def test_context_marks_and_kept_mnemonics(tmp_path: Path) -> None:
    """Wesnoth's layout: games/…/locale/de/LC_MESSAGES, "context^" msgids, "_" in links."""
    debs = tmp_path / "debs"
    debs.mkdir()
    _deb(debs, "wes-data", {
        "usr/share/games/wes/1.16/locale/de/LC_MESSAGES/wes-help.mo": _mo(tmp_path, _catalog([
            {"msgid": "female^Elvish Fighter", "msgstr": "Elfenkämpferin"},
            {"msgid": "time of day^None", "msgstr": "Keine"},
            {"msgid": "See <ref>dst='unit_Mage' text='magi'</ref>.",
             "msgstr": "Siehe <ref>dst='unit_Mage' text='Magier'</ref>."},
        ])),
        "usr/share/doc/wes-data/copyright": COPYRIGHT,
    })
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[[sources]]\nname = "wes"\nkind = "gettext"\npackages = ["wes-data"]\n'
                      'context_mark = "^"\nkeep_mnemonics = ["*"]\n')
    build_corpus("de", tmp_path / "out", recipe=recipe, debs=debs, cache=tmp_path / "cache")
    assert sorted(_pairs(tmp_path / "out" / "wes.tsv.xz")) == [
        ("Elvish Fighter", "Elfenkämpferin"), ("None", "Keine"),
        ("See <ref>dst='unit_Mage' text='magi'</ref>.",
         "Siehe <ref>dst='unit_Mage' text='Magier'</ref>.")]
