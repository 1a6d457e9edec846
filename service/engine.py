"""The engine: a bundle loaded into onnxruntime, translating sentences.

Public surface, as small as CTranslate2's::

    engine = Engine("models/en-de")
    engine.translate(["Hello world."], beam_size=4, num_hypotheses=2)

Texts (segmentation, untranslatables, cache, HTML) go through ``service.translator``; this
sentence-level ``translate`` is the Python API for sentences as given: each hypothesis with
its tokens, token ids and search score, for a program that scores, reranks or aligns
translations (docs/python-api.md). The engine benchmarks (bench/decode.py against
CTranslate2) and the decoding tests take it as their reference. It decodes its sentences in
``service.batch``'s running batches, the machinery the service's scheduler uses too, so
offline and served decoding cannot drift apart.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort

from service.batch import DecodeBatch, Encoded, SourceTooLong
from service.bundle import Bundle, BundleError, load_bundle
from service.cache import BatchCache
from service.device_cache import DeviceCache, DeviceOps, cuda_runs
from service.normalize import build_tables, clean_text
from service.search import DecodeOptions, Translation
from service.vocabulary import Vocabulary

# onnxruntime would fuse the graphs' Add & LayerNorm pairs into SkipLayerNormalization, whose
# CPU kernel is slower at every row count (training.export._GraphBuilder.sublayer).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]
T = TypeVar("T")
R = TypeVar("R")


def available_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota
    (``docker run --cpus``, compose's ``cpus``), which ``os.cpu_count()`` ignores: a container
    limited to 2 CPUs on a 64-core host would otherwise start 64 threads that fight over 2."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = count or 1
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 here, or no quota
    return count


def auto_workers(device: str, threads: int) -> int:
    """Replicas to run when none are asked for: two on a CPU with two or more threads, else one.

    On 2 cores onnxruntime's intra-op threads barely help this small model, while two
    one-thread replicas decoding different batches nearly halve the time (docs/benchmarks.md).
    A GPU runs one replica: its kernels queue on one device anyway, and each replica would
    hold its own weights there.
    """
    return 2 if device == "cpu" and threads >= 2 else 1


# onnxruntime's names of the float types a graph's caches may have
FLOAT_TYPES = {"tensor(float)": np.dtype(np.float32), "tensor(float16)": np.dtype(np.float16)}


def graph_dtype(session: ort.InferenceSession, name: str) -> np.dtype:
    """The numpy dtype of ``session``'s float input ``name``: the fp32 graphs' caches are
    float32, the fp16 variant's float16."""
    kind = next(arg.type for arg in session.get_inputs() if arg.name == name)
    if kind not in FLOAT_TYPES:
        raise BundleError(f"{name} is {kind}; the engine handles {', '.join(FLOAT_TYPES)}")
    return FLOAT_TYPES[kind]


SMALL_DECODER_ROWS = 8  # up to this many rows an int8 decoder step runs on one thread
# Up to this many rows an offline call decodes in its replica's spare batch (Engine._batch_for).
# Beyond it setting a batch up is a small share of the call, and a larger spare's buffers
# would grow to tens of MB.
SPARE_BATCH_ROWS = 8


class Engine:
    """Loads a bundle into onnxruntime and translates sentences with it.

    ``workers`` replicas of the sessions (like CTranslate2's ``inter_threads``) each decode
    their own batches in their own thread, sharing ``threads`` between them; 0 picks them
    (``auto_workers``). ``translate`` spreads its batches over the replicas, and the service's
    scheduler runs one worker thread per replica.
    """

    def __init__(
        self,
        bundle_dir: str | Path,
        device: str = "auto",
        threads: int = 0,
        variant: str | None = None,
        workers: int = 1,
        memory_arena: bool = False,
        device_cache: bool | None = None,
    ):
        if threads < 0 or workers < 0:
            raise ValueError(f"threads and workers must be >= 0, got {threads} and {workers}")
        self.bundle: Bundle = load_bundle(bundle_dir)
        self.memory_arena = memory_arena
        ids = self.bundle.special_ids
        self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]
        try:
            self.vocabulary = Vocabulary.from_manifest(self.bundle.dir, self.bundle.manifest)
        except (OSError, ValueError) as exc:
            raise BundleError(f"{self.bundle.dir}: {exc}") from exc
        if "vocabulary" not in self.bundle.manifest and (
                self.vocabulary.source.pad_id() != self.pad_id
                or self.vocabulary.source.eos_id() != self.eos_id):
            raise BundleError(f"{self.bundle.tokenizer_path}: special ids differ from the manifest")
        self.max_source_tokens = self.bundle.max_positions
        self.decoding_defaults = self.bundle.decoding  # the model's measured best settings
        try:
            self.options()
        except (TypeError, ValueError) as exc:
            raise BundleError(f"{self.bundle.dir}: bad 'decoding' in the manifest: {exc}") from exc
        build_tables()  # the normaliser's table, else the first non-ASCII sentence waits for it
        self.providers = self._providers(device)
        self.variant = variant or self._default_variant()
        # Batches keep their caches in device memory (service.device_cache) on CUDA; True on
        # a CPU runs that code on the CPU provider (its tests).
        self.device_cache = self.device == "cuda" if device_cache is None else device_cache
        model = self.bundle.manifest["model"]
        self.layers, self.heads = model["decoder_layers"], model["heads"]
        self.head_dim = model["head_dim"]
        self.vocab_size = model["vocab_size"]
        threads = threads or available_cpus()
        workers = workers or auto_workers(self.device, threads)
        # onnxruntime intra-op threads per replica: all of ``threads``, split as evenly as
        # they go (3 over 2 replicas: 2 and 1), at least one each.
        shares = [max(1, threads // workers + (i < threads % workers)) for i in range(workers)]
        self.threads = shares[0]
        self._open_sessions()
        # Each replica is a shallow copy; everything but the batches is shared. One-thread
        # replicas on a CPU share the sessions too (onnxruntime runs a session from several
        # threads at once, each call on its caller's thread when it has no pool), so the
        # weights are held once: a second worker added 311 MiB for the Opus-MT-size import
        # in int8 and 562 in fp32 with sessions of its own. Replicas of several threads keep
        # their own, so that each has its own intra-op pool.
        self.replicas: list[Engine] = [self]
        for share in shares[1:]:
            replica = copy.copy(self)
            replica.threads = share
            if not (share == self.threads == 1 and self.device == "cpu"):
                replica._open_sessions()
            replica.replicas = [replica]  # its own translate() must not use the others' sessions
            self.replicas.append(replica)
        for replica in self.replicas:  # each its own (see _batch_for)
            replica._spare, replica._spare_lock = None, threading.Lock()

    def _open_sessions(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        # Idle intra-op threads sleep instead of spinning: faster even alone on 2 cores, and far
        # better when the scheduler, the HTTP side or other containers need the cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # onnxruntime's arena keeps the largest batch's intermediate tensors for good; without it
        # the service holds less memory under load at the same throughput.
        options.enable_cpu_mem_arena = self.memory_arena
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        encoder_path, decoder_path = self.bundle.graph_paths(self.variant)
        session = functools.partial(ort.InferenceSession, providers=self.providers,
                                    disabled_optimizers=DISABLED_OPTIMIZERS)
        self.encoder = session(str(encoder_path), options)
        self.decoder = session(str(decoder_path), options)
        self.cache_dtype = graph_dtype(self.decoder, "self_keys_0")
        self.device_ops = (DeviceOps(self.providers, self.device, self.cache_dtype)
                           if self.device_cache else None)
        # The int8 decoder gets a second session with one thread for steps of up to
        # SMALL_DECODER_ROWS rows: a small step is ~70 kernels of microseconds each, and waking
        # a second thread for each costs more than it saves (not so for fp32 or the encoder).
        # Thread count changes no number (export checks it), so batch invariance holds.
        self.decoder_small = self.decoder
        small_sessions = self.variant == "int8" and self.providers[0] == "CPUExecutionProvider"
        if small_sessions and options.intra_op_num_threads > 1:
            options.intra_op_num_threads = 1
            self.decoder_small = session(str(decoder_path), options)

    @staticmethod
    def _providers(device: str) -> list[str]:
        available = ort.get_available_providers()
        if device == "cpu":
            return ["CPUExecutionProvider"]
        # onnxruntime-gpu lists its CUDA provider even where no GPU or CUDA library is found,
        # and its sessions then run on the CPU: a probe tells.
        if device in ("cuda", "auto") and "CUDAExecutionProvider" in available and cuda_runs():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        if device == "cuda":
            raise RuntimeError(
                "DEVICE=cuda but onnxruntime cannot run on CUDA here "
                f"(providers: {available}; onnxruntime-gpu needs an NVIDIA GPU, its driver and "
                "the CUDA and cuDNN libraries it was built for)"
            )
        if device != "auto":
            raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
        return ["CPUExecutionProvider"]

    def _default_variant(self) -> str:
        """The manifest's choice, except on CUDA: the int8 graphs are shaped for onnxruntime's
        CPU integer kernels, and GroupQueryAttention has CUDA kernels for fp16 and bf16 only,
        so a GPU gets the fp16 graphs when the bundle has them, else fp32 (whose attention then
        runs on the CPU provider). fp16 is never chosen on a CPU: its kernels there convert to
        fp32 and back around most nodes."""
        variants = self.bundle.manifest["variants"]
        if self.device == "cuda":
            return next((name for name in ("fp16", "fp32") if name in variants),
                        self.bundle.manifest["default_variant"])
        return self.bundle.manifest["default_variant"]

    @property
    def device(self) -> str:
        return "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"

    def tokenize(self, sentence: str, target_lang: str | None = None) -> list[int]:
        """Source ids of ``sentence``, normalised as the training corpus was, followed by EOS
        (after the target-language token of a multilingual model)."""
        return self.vocabulary.encode(clean_text(sentence), target_lang)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.vocabulary.decode(ids)

    def new_cache(self) -> BatchCache:
        """Buffers for a batch's caches: in device memory when ``device_cache``."""
        shape = (self.layers, self.heads, self.head_dim, self.vocab_size,
                 self.bundle.max_positions)
        if self.device_ops is not None:
            return DeviceCache(self.device_ops, *shape)
        return BatchCache(*shape, self.cache_dtype)

    def new_batch(self) -> DecodeBatch:
        """A batch for continuous batching."""
        return DecodeBatch(self)

    def translate(
        self, sentences: Sequence[str], max_batch_rows: int = 64,
        target_lang: str | None = None, **options
    ) -> list[Translation]:
        """Translate ``sentences`` (each already a single sentence) into ``target_lang`` (for a
        multilingual model: one of ``vocabulary.target_languages``) with ``DecodeOptions``
        fields as keyword options; those not given come from the bundle's recommended
        ``decoding``, then ``DecodeOptions``' defaults. Raises ``SourceTooLong`` for a
        sentence over the model's positions rather than cutting it."""
        unknown = set(options) - {f.name for f in fields(DecodeOptions)}
        if unknown:
            raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
        decode_options = self.options(**options)
        sources = [self.tokenize(s, target_lang) for s in sentences]
        for index, ids in enumerate(sources):
            if len(ids) > self.max_source_tokens:
                raise SourceTooLong(
                    f"sentence {index} has {len(ids)} tokens; the model "
                    f"accepts at most {self.max_source_tokens}"
                )
        # Longest first keeps the padded batch tight as rows retire; results go back in order.
        # Offline, batches run until they drain, as CTranslate2's do: a row that joins a
        # running batch widens every row's cache and source, which costs more than idle rows.
        # The service's scheduler keeps continuous batching.
        order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
        per_batch = max(max_batch_rows // decode_options.beam_size, 1)
        batches = [order[i : i + per_batch] for i in range(0, len(order), per_batch)]
        results: dict[int, Translation] = {}
        decode = functools.partial(Engine._decode, sources=sources, options=decode_options)
        for done in self.on_replicas(batches, decode):
            results.update(done)
        return [results[i] for i in range(len(sources))]

    def on_replicas(self, items: Sequence[T], work: Callable[[Engine, T], R]) -> list[R]:
        """``work(replica, item)`` for every item, each replica taking the next item as it
        comes free (onnxruntime releases the GIL); the results in the items' order."""
        if len(self.replicas) == 1 or len(items) <= 1:
            return [work(self, item) for item in items]
        queue = deque(enumerate(items))
        results: list[Any] = [None] * len(items)

        def run(replica: Engine) -> None:
            while True:
                try:
                    index, item = queue.popleft()
                except IndexError:  # the last item is taken
                    return
                results[index] = work(replica, item)

        with ThreadPoolExecutor(len(self.replicas)) as pool:
            list(pool.map(run, self.replicas))  # re-raises a replica's error
        return results

    def _decode(
        self, indices: list[int], sources: list[list[int]], options: DecodeOptions
    ) -> dict[int, Translation]:
        """One static batch, decoded to the end on this replica's sessions."""
        with self._batch_for(len(indices) * options.beam_size) as batch:
            for index in indices:
                batch.add(index, sources[index], options)
            batch.reserve_to_drain()
            results: dict[int, Translation] = {}
            while len(batch):
                results.update(batch.step())
            return results

    @contextlib.contextmanager
    def _batch_for(self, rows: int) -> Iterator[DecodeBatch]:
        """A batch for ``rows`` rows: for a few (``SPARE_BATCH_ROWS``), this replica's spare
        one, whose buffers and bindings outlive the call, as the service's running batches do:
        a new batch costs a lone sentence ~10% more, mostly in the decoder's first runs on
        fresh buffers. A new one when another thread has the spare; a call that fails
        leaves the spare behind, in whatever state, for a new one."""
        if rows > SPARE_BATCH_ROWS or not self._spare_lock.acquire(blocking=False):
            yield self.new_batch()
            return
        try:
            if self._spare is None:
                self._spare = self.new_batch()
            yield self._spare
        except BaseException:
            self._spare = None
            raise
        finally:
            self._spare_lock.release()

    def options(self, **overrides) -> DecodeOptions:
        """``DecodeOptions`` with the bundle's recommendations under ``overrides``."""
        return DecodeOptions(**{**self.decoding_defaults, **overrides})

    # -- the two graphs -------------------------------------------------------------------------
    def run_encoder(self, src_tokens: np.ndarray) -> Encoded:
        """Cross keys, cross values, source mask and cross_last (``service.bundle``)."""
        return tuple(self.encoder.run(None, {"src_tokens": src_tokens}))  # type: ignore[return-value]

    def decoder_for(self, rows: int) -> ort.InferenceSession:
        return self.decoder_small if rows <= SMALL_DECODER_ROWS else self.decoder

    def run_decoder(self, session: ort.InferenceSession, binding: ort.IOBinding) -> None:
        """One decoder step on ``binding``'s arrays (a ``DecodeBatch``'s; see service.cache),
        which the graph updates in place."""
        session.run_with_iobinding(binding)


