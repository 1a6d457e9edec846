"""Every knob of the service, read from environment variables in this one place.

Names are the plain field names in upper case (``MODEL_DIR``, ``MAX_QUEUE``, ...), with no prefix,
so a container's environment reads like the documentation. A ``.env`` file is not read: the
environment is the only source, which keeps what runs equal to what ``env`` shows, except for
``translate-serve``'s flags (``--max-queue``, ...), which override it (``settings_from_args``).
"""

from __future__ import annotations

import os
import sys
from argparse import Action, ArgumentParser
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, CliSettingsSource, NoDecode, SettingsConfigDict

# The package sits beside models/ in a checkout and in the images, so the default needs no config.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models"


def _comma_list(value: object) -> object:
    # Environment values are plain strings such as "key1,key2"; JSON lists would surprise operators.
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=False,
        extra="ignore",
        frozen=True,
        # How ``settings_from_args`` reads flags: --max-queue 64, --no-batching, --cors-origins a,b
        cli_prog_name="translate-serve",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_hide_none_type=True,
        cli_avoid_json=True,
        cli_show_env_vars=True,
    )

    model_dir: Path = Field(
        DEFAULT_MODEL_DIR,
        description="Directory of bundles (each a subdirectory with manifest.json), or one bundle.",
    )
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Bundles of MODEL_DIR to load, by directory name, comma-separated (e.g. "
        "'en-de,opus-mt-en-fr'); empty = every bundle there.",
    )
    install_models: bool = Field(
        False,
        description="Install the pairs MODELS names that MODEL_DIR lacks before the service "
        "reports ready, with `translate-models install` (Argos' index, else Opus-MT; needs "
        "the train extra, torch); off, a missing pair stops the start with the command to run.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where onnxruntime runs: 'auto' takes a GPU when onnxruntime can "
        "run on one here, else the CPU; 'cuda' refuses to start without one."
    )
    threads: int = Field(
        0, ge=0, description="CPU threads for onnxruntime, shared by the workers; 0 = the CPUs "
        "the process may use (affinity mask and container CPU quota)."
    )
    workers: int = Field(
        0,
        ge=0,
        description="Decoding workers, each with its own running batch; 0 = 2 on a CPU with 2 "
        "or more threads, 1 on CUDA. One-thread workers share one copy of the weights; "
        "workers of several threads each hold their own.",
    )
    memory_arena: bool = Field(
        False,
        description="Keep onnxruntime's CPU memory arena, which holds on to the largest batch's "
        "intermediate tensors for the life of the process; off (the default) frees them after "
        "each step.",
    )
    variant: str | None = Field(
        None, description=(
            "Bundle variant to serve (fp32, int8, fp16); default: the manifest's choice on "
            "CPU, fp16 on CUDA when the bundle has it, else fp32."
        ),
    )

    batching: bool = Field(
        True,
        description="Continuous batching; off decodes one sentence at a time (for benchmarks).",
    )
    max_batch_tokens: int = Field(
        8192,
        ge=1,
        description="Budget of source + target tokens (times beam) reserved by each worker's "
        "running batch.",
    )
    max_batch_rows: int = Field(
        128,
        ge=1,
        description="Most decoder rows in each worker's running batch (beam_size per sentence).",
    )
    max_queue: int = Field(
        2048, ge=1, description="Most sentences waiting to join the batch before 429 responses."
    )
    failed_keys_per_minute: int = Field(
        20, ge=0, description="Wrong or missing API keys one client address may send a minute; "
        "past it that address gets 429 with Retry-After, without its key being compared. "
        "0 = no limit."
    )
    open_docs: bool = Field(
        False, description="Serve /metrics and the API docs (/docs, /redoc, /openapi.json, "
        "/libretranslate/spec) without a key when keys are asked for (API_KEYS, translate-keys)."
    )
    page: bool = Field(
        True, description="Serve the translator's web page at / (a page to try the service "
        "in a browser; its requests go to this service's own API only)."
    )
    max_loop_lag_s: float = Field(
        0.5, gt=0, description="While the event loop runs this many seconds behind (requests "
        "arriving faster than they can be read), new requests get 503 with Retry-After."
    )
    max_request_sentences: int = Field(
        512,
        ge=1,
        description="Most sentences in one request, counted from its text before any work is "
        "done (else 413); at most MAX_QUEUE. Bounds the share of the queue one request can take, "
        "so that others are never refused because of it.",
    )
    requests_per_minute: int = Field(
        0, ge=0, description="Requests each API key (each client address when no key is asked "
        "for) may send per minute, as a bucket that refills continuously; past it 429 with "
        "Retry-After. 0 = no limit."
    )
    chars_per_minute: int = Field(
        0, ge=0, description="Characters each API key (each client address when no key is "
        "asked for) may send per minute; past it 429 with Retry-After, and 413 for a single "
        "request over it. 0 = no limit."
    )
    usage_limit_chars: int = Field(
        0, ge=0, description="Characters each API key (each client address when no key is "
        "asked for) may translate, through every API, in the life of the process (for good "
        "with STATE_URL); past it 403 "
        "quota_exceeded (LibreTranslate's API 403, DeepL's 456; /v2/usage reports it). "
        "0 = no limit."
    )
    request_timeout_s: float = Field(
        30.0, gt=0, description="Deadline of one request; past it the request gets 504."
    )
    shutdown_delay_s: float = Field(
        5.0, ge=0, description="After the stop signal, how long the service keeps serving "
        "with /ready answering 503, so that load balancers stop sending to it before the "
        "listener closes. Responses meanwhile say 'Connection: close', so that no client is "
        "left holding a kept-alive connection when it closes."
    )
    shutdown_grace_s: float = Field(
        30.0, ge=0, description="After SHUTDOWN_DELAY_S, how long accepted requests may take to "
        "finish; those still running then get 503. Shutdown takes at most the sum of the two."
    )

    header_timeout_s: float = Field(
        10.0, gt=0, description="A connection must send a request's complete headers within "
        "this long of opening (or of its first byte, on a kept-alive connection), else 408 and "
        "closed."
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request's body must arrive within this long of its headers, "
        "else 408 and the connection closed."
    )
    keep_alive_s: int = Field(
        5, ge=1, description="An idle kept-alive connection is closed after this long; set it "
        "above a pooling proxy's idle timeout."
    )
    max_connections: int = Field(
        4096, ge=1, description="Most open client connections. At the cap a new connection "
        "closes the longest-idle one that has no request running, else gets 503. Lowered to fit "
        "the open-file limit (RLIMIT_NOFILE)."
    )

    protect_untranslatables: bool = Field(
        True, description="Mask placeholders (%s, %1$s, {count}), URLs, e-mail addresses, "
        "numbers and emoji before translating and put each back verbatim, as often as it was "
        "there (service/placeholders.py)."
    )
    place_names: bool = Field(
        True, description="Write the place names a bundle lists (its manifest's terms: "
        "Vienna -> Wien) the target language's way, as a glossary's terms are applied; a "
        "request's own glossary comes first."
    )
    data_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get("XDG_DATA_HOME") or
                                     Path.home() / ".local" / "share") / "nmt-service",
        description="Where what must outlive the process is kept: the glossaries' SQLite "
        "file (created when the first glossary is). In the container /data, a volume."
    )
    max_glossary_entries: int = Field(
        100_000, ge=1, description="Most entries in one glossary (else 413)."
    )
    max_glossaries: int = Field(
        1000, ge=1, description="Most glossaries one API key (everyone, when no key is "
        "asked for) may keep (else 403)."
    )
    max_document_chars: int = Field(
        500_000, ge=1, description="Most characters in one uploaded document (else 413)."
    )
    max_documents: int = Field(
        100, ge=1, description="Documents being translated or waiting for their download at "
        "once (else 429)."
    )
    document_ttl_s: float = Field(
        3600.0, gt=0, description="A translated document not downloaded within this long is "
        "deleted."
    )
    document_lease_s: float = Field(
        30.0, gt=0, description="With STATE_URL: a document whose replica has not renewed "
        "its lease for this long (the replica died) reads as failed on the others."
    )
    cache_mb: int = Field(
        64, ge=0, description="Memory (MiB) of the cache of translated sentences, which "
        "answers a sentence seen before with the same model and options; 0 disables it."
    )

    max_chars: int = Field(10_000, ge=1, description="Most characters in one text (else 413).")
    max_texts: int = Field(64, ge=1, description="Most texts in one request (else 413).")
    max_request_chars: int = Field(
        50_000,
        ge=1,
        description="Most characters in one request, all texts together (else 413).",
    )
    max_beam: int = Field(8, ge=1, description="Largest beam_size a request may ask for.")
    default_beam: int = Field(
        2, ge=1,
        description="beam_size used when a request gives none; 1 (greedy) for the most "
        "throughput, larger for better translations at more decoding work.",
    )
    max_length: int = Field(
        256, ge=1, description="Cap on generated tokens per sentence; also the request default."
    )
    no_repeat_ngram_size: int | None = Field(
        None, ge=0, le=64,
        description="Default for requests: no n-gram of this many tokens twice in a "
        "translation, 0 allows repeats; unset: each bundle's recommendation (its manifest's "
        "'decoding'), else 0.",
    )

    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated API keys; when set, every API asks for one (a bearer "
        "token, LibreTranslate's api_key, DeepL's auth key). Empty = open.",
        repr=False,  # keeps the keys out of logged settings
    )
    require_keys: bool = Field(
        False, description="Ask every request for a key even while no key is known (API_KEYS "
        "empty and none added with translate-keys, or the shared key table not read yet). "
        "Otherwise keys are asked for once API_KEYS or translate-keys holds one."
    )
    keys_refresh_s: float = Field(
        2.0, gt=0, description="How often the keys added or removed with translate-keys are "
        "read again (each replica; a change applies within this long)."
    )
    state_url: str = Field(
        "", description="redis://host:port/db (Redis or Valkey) that replicas share: rate "
        "limits, usage, a sentence cache tier, API keys, glossaries and documents. Empty: "
        "each process keeps its own (glossaries and keys in SQLite under DATA_DIR).",
        repr=False,  # may hold a password
    )
    state_timeout_s: float = Field(
        0.25, gt=0, description="Deadline of one call to STATE_URL; past it the call fails and "
        "limits and cache fall back to the process's own until the store answers again."
    )
    shared_cache_entries: int = Field(
        500_000, ge=0, description="Most sentences in the cache tier shared through "
        "STATE_URL (the oldest go first); 0 turns that tier off."
    )
    shared_cache_ttl_s: float = Field(
        7 * 86400.0, gt=0, description="How long a sentence stays in the shared cache tier."
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated origins allowed by CORS; '*' for any."
    )

    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Log level of the service and uvicorn."
    )
    log_json: bool = Field(False, description="One JSON object per log line.")
    host: str = Field("127.0.0.1", description="Bind address; 0.0.0.0 inside a container.")
    port: int = Field(8000, ge=0, le=65535, description="Bind port.")

    _split_lists = field_validator("api_keys", "cors_origins", "models",
                                   mode="before")(_comma_list)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _default_beam_allowed(self) -> Settings:
        if self.default_beam > self.max_beam:
            raise ValueError("DEFAULT_BEAM must not exceed MAX_BEAM")
        return self


def settings_from_args(args: Sequence[str] | None = None) -> Settings:
    """The settings from the environment, overridden by ``translate-serve``'s flags (``args``,
    default ``sys.argv[1:]``). ``--help`` prints the flags and exits 0; an unknown flag or an
    invalid value exits 2 with a message naming it, as argparse does."""
    args = sys.argv[1:] if args is None else list(args)
    parser = ArgumentParser(
        prog="translate-serve",
        allow_abbrev=False,  # a mistyped flag is an error, not another flag it abbreviates
        description="Serve the translation API. Every flag overrides the environment variable "
        "named beside it; API_KEYS is read from the environment only.",
    )
    flags = CliSettingsSource(
        Settings, cli_parse_args=args, root_parser=parser, add_argument_method=_add_flag
    )
    try:
        return Settings(_cli_settings_source=flags(args=args))  # type: ignore[call-arg]
    except ValidationError as exc:
        problems = "; ".join(
            f"{_setting_name(error['loc'])}: {error['msg']}" if error["loc"] else error["msg"]
            for error in exc.errors()
        )
        print(f"translate-serve: error: {problems}", file=sys.stderr)
        raise SystemExit(2) from None


def _add_flag(parser: ArgumentParser, *names: str, **options: Any) -> Action | None:
    # API keys are no flag: a command line is visible to every user of the machine (ps).
    if "--api-keys" in names:
        return None
    return parser.add_argument(*names, **options)


def _setting_name(loc: tuple[int | str, ...]) -> str:
    name = str(loc[0])
    return f"--{name.replace('_', '-')} / {name.upper()}"
