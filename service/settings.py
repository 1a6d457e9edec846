"""Every knob of the service, read from environment variables in this one place.

Names are the plain field names in upper case (``MODEL_DIR``, ``MAX_QUEUE``, ...), with no prefix,
so a container's environment reads like the documentation. A ``.env`` file is not read: the
environment is the only source, which keeps what runs equal to what ``env`` shows, except for
``translate-serve``'s flags (``--max-queue``, ...), which override it (``settings_from_args``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from argparse import Action, ArgumentParser
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, CliSettingsSource, NoDecode, SettingsConfigDict

# The package sits beside models/ in a checkout and in the images, so the default needs no config.
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = ROOT / "models"


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

    # -- models and hardware ------------------------------------------------------------------
    model_dir: Path = Field(
        DEFAULT_MODEL_DIR,
        description="Directory of bundles (each a subdirectory with `manifest.json`), or one "
        "bundle.",
        json_schema_extra={"shown_default": "`models/` of the checkout"},
    )
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Bundles of `MODEL_DIR` to load, by directory name, comma-separated (e.g. "
        "`en-de,opus-mt-en-fr`); empty = every bundle there. Each loaded bundle holds its "
        "weights once (once per worker when workers have several threads each).",
    )
    install_models: bool = Field(
        False,
        description="Install the pairs MODELS names that MODEL_DIR lacks before the service "
        "reports ready, with `translate-models install` (Argos' index, else Opus-MT; needs "
        "the train extra, torch); off, a missing pair stops the start with the command to run.",
    )
    model_memory_mb: float = Field(
        0, ge=0,
        description="Memory for loaded models, in MB; 0 = no budget. Every bundle is served, "
        "loaded on its first request, and the least recently used model no request is using is "
        "unloaded when another needs the room. A model counts as the resident memory its "
        "load added, measured on a load no request ran beside; until then, 1.5 times its "
        "graphs' size.",
    )
    preload: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Models to load at start, by pair (`en-de`) or directory name, "
        "comma-separated; `/ready` waits for them. Empty = every bundle without "
        "`MODEL_MEMORY_MB`, none with it.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where onnxruntime runs: `auto` takes a GPU when onnxruntime can run on one "
        "here, else the CPU; `cuda` refuses to start without one.",
    )
    threads: int = Field(
        0, ge=0,
        description="CPU threads for onnxruntime, shared by the workers; 0 = the CPUs the "
        "process may use (affinity mask and container CPU quota).",
    )
    workers: int = Field(
        0, ge=0,
        description="Decoding workers, each with its own running batch; 0 = 2 on a CPU with 2 "
        "or more threads, 1 on CUDA. One-thread workers share the onnxruntime sessions, so the "
        "weights are held once; workers of several threads each hold their own copy.",
    )
    memory_arena: bool = Field(
        False,
        description="Keep onnxruntime's CPU memory arena, which holds on to the largest batch's "
        "intermediate tensors for the life of the process. Off (the default) they are freed "
        "after each step.",
    )
    malloc_mmap_threshold_kb: int = Field(
        128, ge=0,
        description="Allocations of this many KiB or more get memory of their own from the "
        "system, returned when freed (glibc's `M_MMAP_THRESHOLD`, fixed); 0 = glibc's dynamic "
        "threshold, under which a large batch's buffers stay resident after it ends.",
    )
    numpy_hugepages: bool = Field(
        False,
        description="Let numpy map its large arrays with transparent huge pages (its default "
        "where the kernel's THP mode is `madvise`). Off, a batch's buffers are resident only "
        "where written; on, every 2 MiB region touched is resident whole.",
    )
    variant: str | None = Field(
        None,
        description="Bundle variant to serve (`fp32`, `int8`, `fp16`); default: the manifest's "
        "choice on CPU, fp16 on CUDA when the bundle has it, else fp32.",
        json_schema_extra={"shown_default": "(manifest's choice)"},
    )

    # -- batching and the queue ---------------------------------------------------------------
    batching: bool = Field(
        True,
        description="Continuous batching; off decodes one sentence at a time (for benchmarks).",
    )
    max_batch_tokens: int = Field(
        8192, ge=1,
        description="Budget of source + target tokens (times beam) reserved by each worker's "
        "running batch.",
    )
    # Past 32-64 rows a step costs the same per row on two cores (docs/benchmarks.md, "Why
    # these constants"): more rows only lengthen every sentence's wait and the caches held.
    max_batch_rows: int = Field(
        64, ge=1,
        description="Most decoder rows in each worker's running batch (`beam_size` per "
        "sentence).",
    )
    max_queue: int = Field(
        2048, ge=1,
        description="Most sentences waiting to join the batch before 429 responses. It is the "
        "longest wait you accept times the throughput.",
    )
    max_request_sentences: int = Field(
        512, ge=1,
        description="Most sentences in one request, counted from its text before any work is "
        "done (else 413); at most `MAX_QUEUE`. Bounds the share of the queue one request can "
        "take, so that others are never refused because of it.",
    )

    engine_failure_s: float = Field(
        30.0, gt=0,
        description="How long a worker's engine may fail every decoder step, retried with "
        "back-off (10 ms doubling to 1 s) while a sentence it translated before fails too, "
        "before the engine counts as broken for good: the service then fails `/health` and "
        "exits (status 3) for the orchestrator to restart it. Shorter faults heal by "
        "themselves and lose no request.",
    )

    # -- rates, quotas and keys ---------------------------------------------------------------
    requests_per_minute: int = Field(
        0, ge=0,
        description="Requests each API key (each client address when no key is asked for) may "
        "send per minute, as a bucket that refills continuously; past it 429 with "
        "`Retry-After`; 0 = no limit.",
    )
    chars_per_minute: int = Field(
        0, ge=0,
        description="Characters each API key (each client address when no key is asked for) "
        "may send per minute; past it 429 with `Retry-After`, and 413 for a single request "
        "over it; 0 = no limit.",
    )
    usage_limit_chars: int = Field(
        0, ge=0,
        description="Characters each API key (each client address when no key is asked for) "
        "may translate in the life of the process (for good, and across replicas, with "
        "`STATE_URL`), counted across every API; 0 = no limit. Past it the service's own API "
        "answers 403 `quota_exceeded`, LibreTranslate's 403 and DeepL's 456 (as DeepL answers "
        "a spent quota). `/v2/usage` reports the count and the limit.",
    )
    failed_keys_per_minute: int = Field(
        20, ge=0,
        description="Wrong or missing API keys one client address may send a minute, as a "
        "bucket that refills continuously; 0 = no limit. Past it that address gets 429 with "
        "`Retry-After` and its keys are not compared until the bucket refills, so a guesser "
        "cannot tell a hit from a miss; a key that was right from that address in the last 10 "
        "minutes keeps passing.",
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated API keys; when set, every API asks for one (a bearer token "
        "on the service's own API, `api_key` on LibreTranslate's, `DeepL-Auth-Key` or "
        "`auth_key` on DeepL's); empty = open. Environment only.",
        repr=False,  # keeps the keys out of logged settings
    )
    require_keys: bool = Field(
        False,
        description="Keys are asked for once `API_KEYS` or `translate-keys` holds one; `true` "
        "asks for one even while none is known (a fresh replica whose shared key table cannot "
        "be read yet, before the first key is added).",
    )
    keys_refresh_s: float = Field(
        2.0, gt=0,
        description="How often each process reads the keys `translate-keys` manages (DATA_DIR's "
        "`keys.sqlite3`, or Redis): a key added or removed applies everywhere within this long, "
        "and a request never waits on the table.",
    )
    open_docs: bool = Field(
        False,
        description="With `API_KEYS` set, `/metrics`, `/docs`, `/redoc`, `/openapi.json` and "
        "`/libretranslate/spec` need a key too (a bearer token, a `DeepL-Auth-Key` header, or "
        "`?api_key=` for a browser); `true` serves them to anyone. The probes `/health` and "
        "`/ready` never need one.",
    )

    # -- glossaries and documents -------------------------------------------------------------
    data_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get("XDG_DATA_HOME") or
                                     Path.home() / ".local" / "share") / "nmt-service",
        description="Where what must outlive the process is kept without `STATE_URL`: the "
        "glossaries' SQLite file (`glossaries.sqlite3`, created when the first glossary is) and "
        "the keys `translate-keys` manages (`keys.sqlite3`). In a container, a volume (compose "
        "mounts one; Kubernetes: docs/deploy.md), else glossaries go with the container. A "
        "directory that cannot be written makes the glossary routes answer 503 naming it; "
        "translation without glossaries is unaffected.",
        json_schema_extra={"shown_default": "`~/.local/share/nmt-service` "
                           "(`$XDG_DATA_HOME/nmt-service`); `/data` in the image"},
    )
    max_glossary_entries: int = Field(
        100_000, ge=1,
        description="Most entries in one glossary dictionary, stored or given inline (else "
        "413; a term over 1,024 characters is a 422). A glossary's terms are compiled into "
        "Aho-Corasick automata once per content, off the event loop, and a text is matched in "
        "time linear in its length (`bench/glossary_size.py`).",
    )
    max_glossaries: int = Field(
        1000, ge=1,
        description="Most glossaries one API key (everyone together when no key is asked for) "
        "may keep (else 403).",
    )
    max_document_chars: int = Field(
        500_000, ge=1,
        description="Most characters in one uploaded document (else 413 naming it).",
    )
    max_documents: int = Field(
        100, ge=1,
        description="Documents being translated or waiting for their download at once, all "
        "clients together (else 429 with `Retry-After`): each holds its text and its "
        "translation in memory.",
    )
    document_memory_mb: int = Field(
        256, ge=1,
        description="The uploads and translated files of the documents accepted (being "
        "translated or waiting for their download) held in memory at once, all clients "
        "together, in MiB: an upload past it gets 429 with `Retry-After`, one larger than all "
        "of it 413 (docs/documents.md, \"Memory\").",
    )
    document_workers: int = Field(
        2, ge=1,
        description="Worker processes that parse documents (an upload's check, a job's "
        "reading and writing), and documents translated at once (the others wait, `queued`, "
        "holding only their upload): a parse never holds the event loop, and its memory is "
        "its worker's (docs/documents.md, \"Memory\"). Two keep the batch full.",
    )
    document_worker_mb: int = Field(
        1024, ge=256,
        description="Address space of each document worker process (its `RLIMIT_AS`): a "
        "file whose parsing needs more is refused with 413 and the worker replaced. The "
        "worst file the default limits let through takes about 230 MiB above the worker's "
        "own 29 MiB (docs/documents.md, \"Memory\").",
    )
    document_ttl_s: float = Field(
        3600.0, gt=0,
        description="A translated document not downloaded within this long is deleted; a "
        "downloaded one at once. Jobs run in the process that accepted them: a restart loses "
        "those in progress. With `STATE_URL`, a job's status and file are readable from every "
        "replica.",
    )
    document_lease_s: float = Field(
        30.0, gt=0,
        description="With `STATE_URL`: a replica renews a lease on each document it translates "
        "every third of this; a document whose lease lapsed (its replica died) reads as failed "
        "on the other replicas (\"upload it again\").",
    )

    # -- the page, deadlines, stopping and connections ----------------------------------------
    page: bool = Field(
        True,
        description="Serve the translator's page at `/` and its files under `/page/` "
        "(docs/page.md). It needs no setting of its own: it asks the service for the key "
        "requirement and the limits (`GET /page/settings`), and then calls `/languages` and "
        "`/translate` with the key a person types, as any client does. `false` leaves `/` a "
        "404 (for a service only other services call).",
    )
    max_loop_lag_s: float = Field(
        0.5, gt=0,
        description="While the event loop runs this many seconds behind (smoothed over its last "
        "few 50 ms samples), new requests get 503 `overloaded` with `Retry-After` (and "
        "`Connection: close`) as soon as their headers are read, before their key, body or "
        "route costs anything: requests arriving faster than the loop can read them would "
        "otherwise wait unanswered until their clients give up, or overflow the listen queue "
        "(`LISTEN_BACKLOG`), while the scheduler's queue, which refuses with 429, stays empty. "
        "`/health`, `/ready` and `/metrics` are answered all the same, so that probes do not "
        "restart a server that works.",
    )
    request_timeout_s: float = Field(
        30.0, gt=0,
        description="Deadline of one request; past it the request gets 504 and its sentences "
        "leave the batch.",
    )
    shutdown_delay_s: float = Field(
        5.0, ge=0,
        description="After the stop signal, how long the service keeps serving with `/ready` "
        "answering 503, so that load balancers stop sending to it before the listener closes. "
        "Responses meanwhile say `Connection: close`, so that no client is left holding a "
        "kept-alive connection when it closes.",
    )
    shutdown_grace_s: float = Field(
        30.0, ge=0,
        description="After `SHUTDOWN_DELAY_S`, how long accepted requests may take to finish; "
        "those still running then get 503. Shutdown takes at most the sum of the two.",
    )
    header_timeout_s: float = Field(
        10.0, gt=0,
        description="A connection must send a request's complete headers within this long of "
        "opening (or of its first byte, on a kept-alive connection), else 408 and closed.",
    )
    body_timeout_s: float = Field(
        30.0, gt=0,
        description="A request's body must arrive within this long of its headers, else 408 and "
        "the connection closed.",
    )
    keep_alive_s: int = Field(
        5, ge=1,
        description="An idle kept-alive connection is closed after this long; set it above a "
        "pooling proxy's idle timeout.",
    )
    max_connections: int = Field(
        4096, ge=1,
        description="Most open client connections. At the cap a new connection closes the "
        "longest-idle one that has no request running, else gets 503. Lowered to fit the "
        "open-file limit (`RLIMIT_NOFILE`, whose soft limit is raised as far as the hard one "
        "allows).",
    )
    listen_backlog: int = Field(
        4096, ge=1,
        description="Connections the kernel holds completed for the server to accept "
        "(`listen()`'s backlog), capped by `net.core.somaxconn` (4096 since Linux 5.4; raise both "
        "together). A flood "
        "that outruns the event loop is answered 503 with `Retry-After` as soon as it is "
        "accepted (`MAX_LOOP_LAG_S`); past a full queue the kernel drops new connections "
        "unanswered, which clients see as a timeout or a reset.",
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated addresses or networks (`10.0.0.0/8`) of the reverse "
        "proxies in front of the service: only a connection from one of them is believed about "
        "the client's address (`X-Forwarded-For`, `X-Forwarded-Proto`), which the limits per "
        "address (`FAILED_KEYS_PER_MINUTE`, and the rate limits without keys) count. Empty: "
        "none is believed (uvicorn's own default believes loopback, so that any local process "
        "could pose as any address); `*` believes any, "
        "for a service reachable only through its proxy.",
    )

    # -- what a translation keeps -------------------------------------------------------------
    protect_untranslatables: bool = Field(
        True,
        description="Mask placeholders (`%s`, `%1$s`, `{count}`), URLs, e-mail addresses, names "
        "joined by underscores (`max_length`), numbers and emoji before translating and put "
        "each back verbatim, as often as it was there (docs/placeholders.md).",
    )
    place_names: bool = Field(
        True,
        description="Write the place names a bundle lists (its manifest's `terms`, a TSV such "
        "as `Vienna<TAB>Wien`, made by `translate-train place-names`) the target language's "
        "way. Applied as a glossary's terms are: a sentence whose translation already holds the "
        "name is kept; the others are translated again with the name masked, and keep their "
        "first translation where the model dropped the mask or lost a number the first "
        "translation kept, also among a beam-4 decode's hypotheses. Only a name standing alone, "
        "as written: not inside a longer name (\"Vienna Philharmonic\", \"Milan Kundera\"), not "
        "as a possessive. A request's own glossary comes first (docs/place-names.md).",
    )
    cache_mb: int = Field(
        64, ge=0,
        description="Memory (MiB) of the cache of translated sentences, which answers a "
        "sentence seen before with the same model and options; 0 disables it "
        "(docs/sentence-cache.md).",
    )

    # -- what one request may ask -------------------------------------------------------------
    max_chars: int = Field(10_000, ge=1, description="Most characters in one text (else 413).")
    max_texts: int = Field(64, ge=1, description="Most texts in one request (else 413).")
    max_request_chars: int = Field(
        50_000, ge=1,
        description="Most characters in one request, all texts together (else 413): a request "
        "of this size should finish well within `REQUEST_TIMEOUT_S` beside other traffic.",
    )
    max_beam: int = Field(8, ge=1, description="Largest `beam_size` a request may ask for.")
    default_beam: int = Field(
        2, ge=1,
        description="`beam_size` used when a request gives none; 1 (greedy) for throughput.",
    )
    max_length: int = Field(
        256, ge=1,
        description="Cap on generated tokens per sentence; also the request default.",
    )
    no_repeat_ngram_size: int | None = Field(
        None, ge=0, le=64,
        description="Default for requests: no n-gram of this many tokens twice in a "
        "translation, 0 allows repeats; unset: each bundle's recommendation (its manifest's "
        "`decoding`), else 0.",
        json_schema_extra={"shown_default": "unset"},
    )

    # -- shared state -------------------------------------------------------------------------
    state_url: str = Field(
        "",
        description="`redis://[:password@]host:port/db` (Redis or Valkey): the replicas share "
        "rate limits, usage, API keys, a sentence cache tier, glossaries and documents "
        "(docs/shared-state.md). Empty: each process keeps its own.",
        repr=False,  # may hold a password
    )
    state_timeout_s: float = Field(
        0.25, gt=0,
        description="Deadline of one call to `STATE_URL` (a round trip on a LAN is well under "
        "1 ms). Past it, and for a back-off of 0.5 s doubling to 8 s, limits and cache use the "
        "process's own tier, usage is counted locally and added once Redis answers, and what "
        "only Redis holds answers 503 with `Retry-After`.",
    )
    shared_cache_entries: int = Field(
        500_000, ge=0,
        description="Most sentences in the shared cache tier (the oldest written go first; "
        "about 0.3 KB each for a sentence of 20 words); 0 turns the tier off.",
    )
    shared_cache_ttl_s: float = Field(
        7 * 86400.0, gt=0,
        description="How long a sentence stays in the shared cache tier (a week). Entries are "
        "named by the model's fingerprint, so a new model never gets an old model's "
        "translations; the old ones expire.",
    )

    # -- the server ---------------------------------------------------------------------------
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated origins allowed by CORS; `*` for any.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Log level of the service and uvicorn."
    )
    log_json: bool = Field(False, description="One JSON object per log line.")
    host: str = Field(
        "127.0.0.1",
        description="Bind address; `0.0.0.0` inside a container (the images set it).",
    )
    port: int = Field(8000, ge=0, le=65535, description="Bind port.")
    probe_port: int = Field(
        0, ge=0, le=65535,
        description="A second port, on `HOST`, that serves only `/health`, `/ready` and "
        "`/metrics` (the same answers as on `PORT`, which keeps serving them too), in the "
        "same process: its listen queue is its own, so the orchestrator's probes get through "
        "when a flood of connections fills `PORT`'s (`LISTEN_BACKLOG`). `0` = off, the probes "
        "on `PORT` only. The Kubernetes manifests in `deploy/` probe it.",
    )

    _split_lists = field_validator("api_keys", "cors_origins", "models", "preload",
                                   "trusted_proxies", mode="before")(_comma_list)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: list[str]) -> list[str]:
        for proxy in value:
            if proxy != "*":
                ipaddress.ip_network(proxy, strict=False)  # a ValueError names the bad one
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _default_beam_allowed(self) -> Settings:
        if self.default_beam > self.max_beam:
            raise ValueError("DEFAULT_BEAM must not exceed MAX_BEAM")
        return self

    @model_validator(mode="after")
    def _probe_port_apart(self) -> Settings:
        if self.probe_port and self.probe_port == self.port:
            raise ValueError("PROBE_PORT must differ from PORT (or be 0, off)")
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


# -- the settings tables of the documentation ---------------------------------------------------
# docs/configuration.md lists every setting and README.md the few a new user needs, both
# generated from the fields above so that they cannot drift from what is read; a test fails
# while the committed tables differ.
REGENERATE = "python -m service.settings --markdown"
README_SETTINGS = ("model_dir", "models", "device", "threads", "workers", "host", "port",
                   "api_keys", "requests_per_minute", "default_beam", "cache_mb", "state_url")
BEGIN_TABLE = f"<!-- settings table: generated from service/settings.py by {REGENERATE} -->"
END_TABLE = "<!-- end of the settings table -->"


def settings_table(names: Sequence[str] | None = None, docs: str = "") -> str:
    """A Markdown table of the settings ``names`` (default: all), each with its variable, its
    default and its description; with ``names``, each description's first sentence only.
    ``docs/x.md`` in a description becomes a link, ``docs`` being the prefix that the page the
    table is in needs before ``x.md``."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name in names or Settings.model_fields:
        field = Settings.model_fields[name]
        meaning = field.description or ""
        if names is not None:
            meaning = re.split(r"(?<=\.)\s+(?=[A-Z])", meaning, maxsplit=1)[0]
        meaning = re.sub(r"docs/([\w-]+\.md)",
                         lambda link: f"[{docs}{link[1]}]({docs}{link[1]})", meaning)
        meaning = meaning.replace("|", r"\|")  # a bar would end the cell
        rows.append(f"| `{name.upper()}` | {_shown_default(field)} | {meaning} |")
    return "\n".join(rows)


def _shown_default(field: FieldInfo) -> str:
    # A default computed where the service runs (a path) is described in words instead.
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "shown_default" in extra:
        return str(extra["shown_default"])
    value = field.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        value = ",".join(value)  # as the environment spells a list
    return f"`{value}`" if value != "" else '`""`'


def documented(root: Path = ROOT) -> dict[Path, str]:
    """docs/configuration.md and README.md under ``root`` as they should read: each with the
    table between its markers generated from the settings."""
    wanted = {}
    for relative, names, docs in [("docs/configuration.md", None, ""),
                                  ("README.md", README_SETTINGS, "docs/")]:
        path = root / relative
        text = path.read_text(encoding="utf-8")
        head, begin, rest = text.partition(BEGIN_TABLE)
        _, end, tail = rest.partition(END_TABLE)
        if not (begin and end):
            raise ValueError(f"{path}: no settings table between {BEGIN_TABLE} and {END_TABLE}")
        wanted[path] = f"{head}{BEGIN_TABLE}\n{settings_table(names, docs)}\n{END_TABLE}{tail}"
    return wanted


def write_tables(root: Path = ROOT) -> list[Path]:
    """Rewrite the settings tables under ``root`` that differ from ``documented``; returns the
    files rewritten."""
    rewritten = []
    for path, text in documented(root).items():
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            rewritten.append(path)
    return rewritten


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        raise SystemExit(f"usage: {REGENERATE} (rewrites the settings tables of "
                         "docs/configuration.md and README.md)")
    for path in write_tables():
        print(f"rewrote the settings table of {path}")
