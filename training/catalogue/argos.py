"""Argos Translate's package index (the JSON list ``argospm`` reads, LibreTranslate's source
of models) and its ``.argosmodel`` packages: read, downloaded, checked."""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from training.catalogue import CatalogueError
from training.catalogue.download import download, read_location

# Where Argos Translate itself reads the index (argostranslate/settings.py's remote index).
PUBLIC_INDEX = "https://raw.githubusercontent.com/argosopentech/argospm-index/main/index.json"


def index_location() -> str:
    return os.environ.get("ARGOS_PACKAGE_INDEX") or PUBLIC_INDEX


@dataclass(frozen=True)
class ArgosPackage:
    """One entry of the index: a package version for one pair."""

    code: str
    from_code: str
    to_code: str
    package_version: str
    argos_version: str
    links: tuple[str, ...]
    size: int | None  # bytes, where the index says

    @property
    def pair(self) -> str:
        return f"{self.from_code}-{self.to_code}"

    @property
    def version_key(self) -> tuple[int, ...]:
        return tuple(int(part) if part.isdigit() else 0
                     for part in self.package_version.split("."))


def read_index(location: str | None = None) -> list[ArgosPackage]:
    """Every translation package version the index lists (other types, such as sentence
    boundary models, are not pairs)."""
    location = location or index_location()
    try:
        entries = json.loads(read_location(location))
    except json.JSONDecodeError as error:
        raise CatalogueError(f"the Argos index {location} is not JSON ({error})") from error
    if not isinstance(entries, list):
        raise CatalogueError(f"the Argos index {location} is not a list of packages")
    packages = []
    for entry in entries:
        if entry.get("type", "translate") != "translate" or not entry.get("links"):
            continue
        packages.append(ArgosPackage(
            code=entry.get("code", ""), from_code=entry["from_code"], to_code=entry["to_code"],
            package_version=str(entry.get("package_version", "")),
            argos_version=str(entry.get("argos_version", "")),
            links=tuple(entry["links"]), size=entry.get("size")))
    return packages


def newest(packages: list[ArgosPackage], pair: str) -> ArgosPackage | None:
    found = [package for package in packages if package.pair.lower() == pair.lower()]
    return max(found, key=lambda package: package.version_key) if found else None


def _verifier(package: ArgosPackage, url: str):
    """The checks a downloaded package passes: the size the index gives, every member's
    CRC (a zip stores one; the index has no hash) and metadata naming the index's pair."""

    def verify(path: Path) -> None:
        where = f"{package.pair}: {url}"
        if package.size is not None and path.stat().st_size != package.size:
            raise CatalogueError(f"{where}: corrupt download: {path.stat().st_size} bytes, "
                                 f"the index says {package.size}")
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
                if bad is not None:
                    raise CatalogueError(f"{where}: corrupt download: {bad} fails its CRC")
                names = [n for n in archive.namelist() if n.endswith("metadata.json")]
                if not names:
                    raise CatalogueError(f"{where}: not an Argos package (no metadata.json)")
                metadata = json.loads(archive.read(min(names, key=len)))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as error:
            raise CatalogueError(f"{where}: corrupt download: {error}") from error
        codes = (metadata.get("from_code"), metadata.get("to_code"))
        if codes != (package.from_code, package.to_code):
            raise CatalogueError(f"{where}: the package translates {codes[0]}-{codes[1]}, "
                                 f"not {package.pair}")

    return verify


def fetch(package: ArgosPackage, cache_dir: Path) -> Path:
    """The package's ``.argosmodel`` in ``cache_dir`` (downloaded, or resumed, from its first
    link that answers)."""
    errors = []
    for url in package.links:
        name = Path(urlparse(url).path).name or f"{package.code}.argosmodel"
        destination = cache_dir / "argos" / f"{package.package_version}-{name}"
        try:
            return download(url, destination, f"{package.pair} (argos {package.package_version})",
                            verify=_verifier(package, url))
        except CatalogueError as error:
            errors.append(error)
    if len(errors) == 1:
        raise errors[0]
    raise CatalogueError(f"{package.pair}: no link answered: " +
                         "; ".join(str(error) for error in errors))
