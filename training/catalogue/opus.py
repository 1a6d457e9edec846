"""Helsinki-NLP's Opus-MT models (MarianMT, ``Helsinki-NLP/opus-mt-{src}-{tgt}`` and the
multilingual ones such as ``opus-mt-en-ROMANCE``) through the ``huggingface_hub`` client, so
that ``HF_ENDPOINT`` (a mirror), ``HF_HUB_OFFLINE`` and its cache work as users know them.
The environment is read at each call, not when the hub's module is first imported."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from training.catalogue import CatalogueError, parse_pair

ORGANISATION = "Helsinki-NLP"
PREFIX = "opus-mt-"
# What the importer reads of a MarianMT repository (the weights as one of two files).
TOKENIZER_FILES = ("config.json", "source.spm", "target.spm", "vocab.json",
                   "target_vocab.json", "tokenizer_config.json")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


# Opus-MT names its multilingual repositories by language groups: ISO 639-5 codes (roa, gem,
# ...), ``mul`` for many, or a name in capitals (ROMANCE, SCANDINAVIA, CELTIC).
GROUPS = frozenset({
    "aav", "afa", "alv", "art", "ast", "bat", "bnt", "cau", "ccs", "cel", "cpf", "cpp", "crp",
    "cus", "dra", "euq", "fiu", "gem", "gmq", "gmw", "grk", "hyx", "iir", "inc", "ine", "ira",
    "itc", "map", "mkh", "mul", "nic", "phi", "poz", "roa", "sal", "sem", "sit", "sla", "trk",
    "urj", "zle", "zls", "zlw", "zhx"})
# ISO 639-1 codes with the names Opus-MT's multilingual models give the languages in their
# cards and target-language tokens (ISO 639-3, the macrolanguage's members where its models use
# those), likeliest first; a code not here is looked up as itself only.
ISO639_3 = {
    "ar": ("ara", "arb"), "az": ("aze", "azj"), "be": ("bel",), "bg": ("bul",),
    "bn": ("ben",), "ca": ("cat",), "cs": ("ces",), "cy": ("cym",), "da": ("dan",),
    "de": ("deu",), "el": ("ell",), "en": ("eng",), "eo": ("epo",), "es": ("spa",),
    "et": ("est",), "eu": ("eus",), "fa": ("fas", "pes"), "fi": ("fin",), "fr": ("fra",),
    "ga": ("gle",), "gl": ("glg",), "he": ("heb",), "hi": ("hin",), "hr": ("hrv",),
    "hu": ("hun",), "hy": ("hye",), "id": ("ind",), "is": ("isl",), "it": ("ita",),
    "ja": ("jpn",), "ka": ("kat",), "kk": ("kaz",), "ko": ("kor",), "lb": ("ltz",),
    "lt": ("lit",), "lv": ("lav",), "mk": ("mkd",), "ms": ("msa", "zsm_Latn", "zsm"),
    "mt": ("mlt",), "nb": ("nob",), "nl": ("nld",), "nn": ("nno",), "no": ("nor", "nob"),
    "pl": ("pol",), "pt": ("por",), "ro": ("ron",), "ru": ("rus",), "sk": ("slk",),
    "sl": ("slv",), "sq": ("sqi", "als"), "sr": ("srp_Cyrl", "srp"), "sv": ("swe",),
    "sw": ("swa", "swh"), "th": ("tha",), "tl": ("tgl",), "tr": ("tur",), "uk": ("ukr",),
    "ur": ("urd",), "vi": ("vie",), "zh": ("zho", "cmn_Hans", "cmn"),
}
# The lines of a model card that list its languages: "* target languages: es,fr,it" (the
# first Opus-MT cards), "- source language(s): deu eng" (the Tatoeba Challenge's).
_CARD_LANGUAGES = re.compile(r"^[\s*-]*(source|target) languages?(?:\(s\))?\s*:(.*)$",
                             re.IGNORECASE | re.MULTILINE)


def language_forms(code: str) -> list[str]:
    """The names ``code`` may have in a multilingual model, lowercased: es -> es, spa."""
    code = code.lower()
    return [code, *(form.lower() for form in ISO639_3.get(code, ()))]


@dataclass(frozen=True)
class OpusModel:
    repo: str
    name: str  # the bundle's directory: en-de, en-ROMANCE
    # Installed by pair: its languages, so a multilingual repository serves that pair alone.
    source: str | None = None
    target: str | None = None


def for_pair(pair: str) -> OpusModel:
    """``en-de`` → Helsinki-NLP/opus-mt-en-de; a repository id names itself."""
    if "/" in pair:
        name = pair.rsplit("/", 1)[1]
        return OpusModel(pair, name.removeprefix(PREFIX))
    return OpusModel(f"{ORGANISATION}/{PREFIX}{pair}", pair)


def _is_group(name: str) -> bool:
    return name.lower() in GROUPS or (name.isupper() and len(name) > 3)


def _repo_languages(repo: str) -> tuple[str, str] | None:
    """(source, target) of Helsinki-NLP/opus-mt-en-ROMANCE; None for another naming."""
    name = repo.rsplit("/", 1)[-1]
    if not name.startswith(PREFIX) or name.count("-") != 3:
        return None  # opus-mt-tc-big-en-itc and the like: not searched by pair
    source, target = name.removeprefix(PREFIX).split("-")
    return source, target


def candidates(source: str, target: str, repos: list[str]) -> list[str]:
    """The repositories among ``repos`` that may translate source -> target: the bilingual one,
    then those with a group on one side (capitals and ISO 639-5 groups before ``mul``), then
    those with groups on both sides."""
    ranked = []
    for repo in repos:
        languages = _repo_languages(repo)
        if languages is None:
            continue
        exact = [name.lower() == wanted for name, wanted in zip(languages, (source, target),
                                                                 strict=True)]
        group = [_is_group(name) for name in languages]
        if not all(e or g for e, g in zip(exact, group, strict=True)):
            continue
        rank = (sum(group), sum(name.lower() == "mul" for name in languages))
        ranked.append((rank, repo))
    return [repo for _, repo in sorted(ranked)]


def card_languages(text: str) -> dict[str, set[str]]:
    """{"source": names, "target": names} a model card lists, lowercased (empty when it
    lists none)."""
    found: dict[str, set[str]] = {"source": set(), "target": set()}
    for side, names in _CARD_LANGUAGES.findall(text):
        found[side.lower()] |= {name.lower() for name in re.split(r"[\s,;`]+", names) if name}
    return found


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None  # the hub's own default (~/.cache/huggingface/hub)


def _url(model: OpusModel) -> str:
    return f"{_endpoint() or 'https://huggingface.co'}/{model.repo}"


def _hub():
    """The hub's client, which the train extra brings (the serving image has none)."""
    try:
        import huggingface_hub
    except ImportError:
        raise CatalogueError("Opus-MT needs huggingface_hub, which is not installed here: "
                             "pip install '.[train]'") from None
    return huggingface_hub


def available() -> list[str]:
    """The Opus-MT repositories the hub lists."""
    api = _hub().HfApi(endpoint=_endpoint())
    try:
        found = api.list_models(author=ORGANISATION, search=PREFIX)
        return sorted(model.id for model in found)
    except Exception as error:  # the client's errors have no common base but Exception
        raise CatalogueError(f"{_endpoint() or 'https://huggingface.co'}: cannot list "
                             f"Opus-MT models ({_one_line(error)})") from error


def _one_line(error: BaseException) -> str:
    """The cause, without the layers of wrappers requests puts around a socket's error."""
    text = " ".join(str(error).split())
    socket_error = re.search(r"\[Errno -?\d+\] [^'\")(]+", text)
    return socket_error.group(0).strip() if socket_error else text or type(error).__name__


def _verify(model: OpusModel, path: Path, size: int | None, sha256: str | None) -> None:
    """The hub's own size and, for files in LFS, SHA-256; a file that fails leaves the cache
    (its blob), so that the next install downloads it again."""
    problem = None
    if size is not None and path.stat().st_size != size:
        problem = f"{path.stat().st_size} bytes, the hub says {size}"
    elif sha256 is not None:
        digest = hashlib.sha256()
        with path.open("rb") as file:
            while block := file.read(1 << 20):
                digest.update(block)
        if digest.hexdigest() != sha256:
            problem = f"SHA-256 {digest.hexdigest()[:12]}..., the hub says {sha256[:12]}..."
    if problem:
        path.resolve().unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise CatalogueError(f"{model.name}: {_url(model)}/{path.name}: corrupt download "
                             f"({problem})")


def fetch(model: OpusModel) -> tuple[Path, str]:
    """The repository's files the importer reads, in the hub's cache: (their directory, the
    commit). Offline, what the cache holds, or one line saying it holds nothing."""
    _hub()
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError

    if offline():
        try:
            path = Path(snapshot_download(model.repo, cache_dir=_cache_dir(),
                                          local_files_only=True,
                                          allow_patterns=[*TOKENIZER_FILES, *WEIGHTS]))
        except LocalEntryNotFoundError as error:
            raise CatalogueError(f"{model.name}: offline (HF_HUB_OFFLINE is set) and "
                                 f"{model.repo} is not in the hub's cache") from error
        return path, path.name
    api = HfApi(endpoint=_endpoint())
    try:
        info = api.model_info(model.repo, files_metadata=True)
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        raise CatalogueError(f"{model.name}: {_url(model)}: HTTP {status} (no such "
                             "Opus-MT model?)") from error
    except OSError as error:  # requests' connection errors are OSErrors
        raise CatalogueError(f"{model.name}: offline: cannot reach {_url(model)} "
                             f"({_one_line(error)})") from error
    siblings = {sibling.rfilename: sibling for sibling in info.siblings or []}
    weights = next((name for name in WEIGHTS if name in siblings), None)
    if weights is None:
        raise CatalogueError(f"{model.name}: {_url(model)}: neither model.safetensors nor "
                             "pytorch_model.bin (not a MarianMT repository?)")
    wanted = [name for name in TOKENIZER_FILES if name in siblings] + [weights]
    directory = None
    for name in wanted:
        sibling = siblings[name]
        if not sys.stderr.isatty():  # on a terminal the hub's client draws its own bars
            size = f", {sibling.size / 1e6:.1f} MB" if sibling.size else ""
            print(f"{model.name} (opus-mt): {model.repo}/{name}{size}", file=sys.stderr,
                  flush=True)
        try:
            # The default revision, not info.sha: the cache then records the commit as
            # main's, which an offline install later resolves.
            path = Path(hf_hub_download(model.repo, name, endpoint=_endpoint(),
                                        cache_dir=_cache_dir()))
        except Exception as error:  # connection, HTTP and consistency errors alike
            raise CatalogueError(f"{model.name}: {_url(model)}/{name}: "
                                 f"{_one_line(error)}") from error
        lfs = sibling.lfs
        _verify(model, path, sibling.size, lfs.sha256 if lfs else None)
        directory = path.parent
    assert directory is not None
    return directory, info.sha or directory.name


def _cached_repos() -> list[str]:
    """The Opus-MT repositories the hub's cache holds (offline, the ones there are)."""
    from huggingface_hub import scan_cache_dir

    try:
        cache = scan_cache_dir(_cache_dir())
    except Exception:  # no cache yet (CacheNotFound), or one the scan cannot read
        return []
    return sorted(repo.repo_id for repo in cache.repos
                  if repo.repo_type == "model" and repo.repo_id.startswith(f"{ORGANISATION}/"))


def _file(model: OpusModel, name: str) -> Path | None:
    """One small file of a repository (its card, its vocabulary), from the hub or its cache;
    None when the repository has no such file."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(model.repo, name, endpoint=_endpoint(),
                                    cache_dir=_cache_dir()))
    except (EntryNotFoundError, LocalEntryNotFoundError):
        return None
    except Exception as error:  # connection and HTTP errors alike
        raise CatalogueError(f"{model.name}: {_url(model)}/{name}: {_one_line(error)}") from error


def _covers(model: OpusModel, source: str, target: str) -> bool:
    """Whether multilingual ``model`` translates source -> target: a group on the target side
    must have a token for the target in its vocabulary (not looked at when its card lists
    target languages without it), a group on the source side must be listed among the source
    languages of its card."""
    languages = _repo_languages(model.repo)
    assert languages is not None  # a candidate
    card = _file(model, "README.md")
    listed = card_languages(card.read_text(encoding="utf-8")) if card else {"source": set(),
                                                                           "target": set()}
    if _is_group(languages[1]):
        if listed["target"] and not set(language_forms(target)) & listed["target"]:
            return False  # the card's list says no: its vocabulary (MBs) is not downloaded
        vocabulary = _file(model, "vocab.json")
        try:
            if vocabulary is None or target_token(vocabulary.parent, target) is None:
                return False
        except CatalogueError:  # tokens, but none for the target
            return False
    return not (_is_group(languages[0]) and not set(language_forms(source)) & listed["source"])


def resolve(pair: str) -> OpusModel:
    """The Opus-MT model that serves ``pair`` (en-es): Helsinki-NLP/opus-mt-en-es where the hub
    has it, else a multilingual one (opus-mt-en-ROMANCE, opus-mt-en-roa, opus-mt-en-mul,
    opus-mt-mul-en, ...) that covers both languages, to serve that pair alone. Offline, the
    repositories in the hub's cache are the ones searched."""
    _hub()
    source, target = (code.lower() for code in parse_pair(pair))
    bilingual = OpusModel(f"{ORGANISATION}/{PREFIX}{source}-{target}", pair, source, target)
    if offline():
        repos = _cached_repos()
    else:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import RepositoryNotFoundError

        api = HfApi(endpoint=_endpoint())
        try:
            api.model_info(bilingual.repo)
            return bilingual
        except RepositoryNotFoundError:
            pass  # no bilingual model: a multilingual one, below
        except Exception as error:  # the client's connection and HTTP errors
            if isinstance(error, OSError):
                raise CatalogueError(f"{pair}: offline: cannot reach {_url(bilingual)} "
                                     f"({_one_line(error)})") from error
            raise CatalogueError(f"{pair}: {_url(bilingual)}: {_one_line(error)}") from error
        repos = available()
    if bilingual.repo in repos:
        return bilingual
    tried = []
    for repo in candidates(source, target, repos):
        if repo == bilingual.repo:
            continue
        model = OpusModel(repo, pair, source, target)
        tried.append(repo.rsplit("/", 1)[1])
        if _covers(model, source, target):
            print(f"{pair} (opus-mt): no {bilingual.repo}; {repo} serves it", file=sys.stderr,
                  flush=True)
            return model
    others = (f"; the multilingual {', '.join(tried)} do not cover it" if tried
              else "; no multilingual repository is named for both languages")
    if offline():
        raise CatalogueError(f"{pair}: offline (HF_HUB_OFFLINE is set) and {bilingual.repo} is "
                             f"not in the hub's cache{others}")
    raise CatalogueError(f"{pair}: no Opus-MT model: {_url(bilingual)} does not exist{others}")


def target_token(directory: Path, target: str) -> str | None:
    """The token that asks the model in ``directory`` (its vocab.json) for ``target``, which
    its sources start with: None for a model without target-language tokens, a
    ``CatalogueError`` for one without ``target``'s."""
    from training.importers import language_tokens

    mapping = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    tokens = language_tokens(list(mapping))
    if not tokens:
        return None
    for form in language_forms(target):
        if form in tokens:
            return tokens[form]
    listed = ", ".join(sorted(tokens.values())[:12]) + (", ..." if len(tokens) > 12 else "")
    raise CatalogueError(f"its sources need a target-language token and it has none for "
                         f"{target!r} ({listed})")
