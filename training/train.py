"""The training loop, top to bottom: data, model, optimiser, steps, validation, checkpoints.

One process trains on one device; under ``torchrun`` (``WORLD_SIZE`` > 1) every process does
the same on its own share of the batches and DistributedDataParallel averages the gradients;
rank 0 alone validates, logs and writes checkpoints while the others wait for it.

Resuming (``train(config, resume=True)``) continues from ``{out_dir}/checkpoint_last.pt``
exactly: the parameters, optimiser, schedule, loss scaler, data position and every random
generator are restored, so a run interrupted after a checkpoint and resumed ends with the same
parameters as one that never stopped (on CPU bit for bit; on GPU up to kernel non-determinism).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import gc
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from training.batching import (
    BatchIterator,
    TokenizedSplit,
    collate,
    load_split,
    make_batches,
    split_file,
)
from training.config import BOS_ID, EOS_ID, PAD_ID, Config, ModelConfig
from training.model import Transformer

logger = logging.getLogger(__name__)

CHECKPOINT_LAST = "checkpoint_last.pt"
CHECKPOINT_BEST = "checkpoint_best.pt"
CHECKPOINT_AVG = "checkpoint_avg.pt"
_PERIODIC = re.compile(r"checkpoint_(\d+)\.pt$")
# Learning-rate ramp after --init-from: ~one Adam beta2 horizon (1 / (1 - 0.98) = 50 steps) four
# times over, so the second-moment estimates settle before updates reach full size.
REWARM_STEPS = 200

# ---------------------------------------------------------------------------------------------
# Pieces of the loop


def _shape(model_config: dict[str, Any]) -> dict[str, Any]:
    """A model config without its training-only settings: a run may continue another's weights
    with a different dropout (the recipe comparisons in docs/en-de-baseline.md do). Fields a
    checkpoint predates take their defaults, which are what it was trained with."""
    complete = dataclasses.asdict(ModelConfig(**model_config))
    return {key: value for key, value in complete.items() if key != "dropout"}


def init_model(config: Config) -> Transformer:
    """The model every rank starts from: parameters drawn from ``config.train.seed``."""
    torch.manual_seed(config.train.seed)
    return Transformer(config.model)


def noam_factor(step: int, warmup: int) -> float:
    """§5.3: min(step^-0.5, step * warmup^-1.5), with ``step`` counted from 1. LambdaLR calls
    this with the number of optimiser steps already taken, hence the +1."""
    step += 1
    if warmup <= 0:
        return step**-0.5
    return min(step**-0.5, step * warmup**-1.5)


def restarted_factor(step: int, warmup: int, restart: int, rewarm: int) -> float:
    """``noam_factor`` for a run that continued at step ``restart`` from weights alone
    (``init_from``): the same schedule, ramped up again over ``rewarm`` steps, because fresh
    Adam moments make the first updates about lr-sized in every coordinate."""
    ramp = min(1.0, (step - restart + 1) / rewarm) if rewarm > 0 else 1.0
    return noam_factor(step, warmup) * ramp


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor,
                       smoothing: float) -> torch.Tensor:
    """Summed cross-entropy over the non-PAD target tokens (§5.4 label smoothing)."""
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=PAD_ID,
                           label_smoothing=smoothing, reduction="sum")


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: there bf16 autocast is ~1.7x the fp32 step rate. Elsewhere (AVX2
    only, e.g. an AMD EPYC Zen 3) it is emulated: measured ~13x slower than fp32 there."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: play safe
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None = plain fp32): auto is bf16 on a CUDA device that has it,
    else fp16 on CUDA; on a CPU, bf16 where the cores compute it natively, else fp32."""
    if precision == "auto":
        if device.type != "cuda":
            return torch.bfloat16 if cpu_has_native_bf16() else None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in dtypes:
        raise ValueError(f"train.precision must be auto, fp32, bf16 or fp16, not {precision!r}")
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("train.precision=fp16 needs a CUDA device")
    return dtypes[precision]


def rng_state() -> dict[str, Any]:
    """Every random generator the loop touches, as plain values and tensors (so a checkpoint
    loads with ``torch.load(weights_only=True)``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def params_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal digests mean bit-identical parameters."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Checkpoint files


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to a temporary file, then rename over ``path``: never a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def link_atomic(src: Path, dst: Path) -> None:
    """Make ``dst`` name the same file as ``src`` (a hard link; a copy where links fail)."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _check_same_vocab(used: Path, configured: Path) -> None:
    """Token ids mean nothing under another SentencePiece model: refuse to mix them."""
    if not used.is_file():
        raise FileNotFoundError(f"--init-from: the checkpoint's vocabulary {used} is missing")
    if used.read_bytes() != configured.read_bytes():
        raise ValueError(f"--init-from: the checkpoint's vocabulary {used} differs from "
                         f"{configured}; copy it there (the bundle's sentencepiece.model)")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def update_best(best: list[tuple[float, str]], bleu: float, path: str,
                keep: int) -> tuple[list[tuple[float, str]], list[str], bool]:
    """Add ``(bleu, path)`` to the best-``keep`` list (highest BLEU first; the earlier one wins
    a tie). Returns the new list, the paths that fell out of it, and whether ``path`` got in."""
    ranked = sorted([*best, (float(bleu), str(path))], key=lambda item: -item[0])
    kept, dropped = ranked[:keep], [p for _, p in ranked[keep:]]
    return kept, dropped, str(path) in {p for _, p in kept}


def periodic_checkpoints(out_dir: Path) -> list[Path]:
    """``checkpoint_{step}.pt`` files in ``out_dir``, oldest first."""
    found = [(int(m.group(1)), p) for p in out_dir.glob("checkpoint_*.pt")
             if (m := _PERIODIC.search(p.name))]
    return [p for _, p in sorted(found)]


def average_checkpoints(paths: list[str | Path], out_path: str | Path) -> Path:
    """Average the model parameters of ``paths`` (floating-point tensors; others come from the
    last) into a checkpoint at ``out_path`` with the last one's model/config/vocab keys."""
    if not paths:
        raise ValueError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    last: dict[str, Any] = {}
    for path in paths:
        last = load_checkpoint(path)
        for name, tensor in last["model"].items():
            if tensor.is_floating_point():
                total[name] = total.get(name, 0) + tensor.double()
    state = {name: (total[name] / len(paths)).to(tensor.dtype) if name in total else tensor
             for name, tensor in last["model"].items()}
    averaged = {key: last.get(key) for key in ("model_config", "config", "step", "vocab",
                                                "metrics")}
    averaged["model"] = state
    averaged["averaged_from"] = [str(Path(p).resolve()) for p in paths]
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic(averaged, out_path)
    return out_path


# ---------------------------------------------------------------------------------------------
# Validation


@torch.no_grad()
def validate(model: Transformer, dev: TokenizedSplit, references: list[str], sp,
             config: Config, device: torch.device, autocast) -> dict[str, float]:
    """Dev loss (plain NLL per target token, no smoothing) over the whole dev split, and BLEU /
    chrF of greedy translations of its first ``dev_bleu_sentences`` pairs."""
    import sacrebleu

    was_training = model.training
    model.eval()
    nll, tokens = 0.0, 0
    for indices in make_batches(dev.src_lengths, dev.tgt_lengths, config.train.batch_tokens,
                                shuffle=False):
        batch = collate(dev, indices).to(device)
        with autocast():
            logits = model(batch.src, batch.tgt_input)
        nll += label_smoothed_nll(logits, batch.tgt_output, 0.0).item()
        tokens += batch.target_tokens
    count = min(config.train.dev_bleu_sentences, len(dev))
    hypotheses = [""] * count
    order = np.argsort(dev.src_lengths[:count], kind="stable")
    for start in range(0, count, 64):
        indices = order[start : start + 64]
        batch = collate(dev, indices).to(device)
        max_length = int(batch.src.size(1) * 1.5) + 10
        with autocast():
            decoded = model.greedy_decode(batch.src, max_length, BOS_ID, EOS_ID)
        for i, ids in zip(indices, decoded, strict=True):
            hypotheses[i] = sp.decode(ids)
    refs = [references[i] for i in dev.kept[:count]]
    model.train(was_training)
    dev_loss = nll / max(tokens, 1)
    return {
        "dev_loss": dev_loss,
        "dev_ppl": math.exp(min(dev_loss, 50.0)),
        "bleu": sacrebleu.corpus_bleu(hypotheses, [refs]).score if count else 0.0,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [refs]).score if count else 0.0,
    }


# ---------------------------------------------------------------------------------------------
# The loop


def _setup_distributed() -> tuple[int, int, torch.device, bool]:
    """Rank, world size and device from torchrun's environment; joins the process group
    (and says so, so that the caller leaves it again) when there is more than one process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    joined = world_size > 1 and not dist.is_initialized()
    if joined:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(hours=1))
    return rank, world_size, device, joined


def _broadcast_flag(value: bool, world_size: int, device: torch.device) -> bool:
    """Rank 0's decision, known to every rank (and a barrier: nobody passes before rank 0)."""
    if world_size == 1:
        return value
    flag = torch.tensor([int(value)], device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _summary_writer(out_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # TensorBoard is optional; metrics.jsonl has everything
        return None
    return SummaryWriter(str(out_dir / "tensorboard"))


class _StopSignal:
    """SIGTERM or SIGINT asks the loop to stop after the current step with a checkpoint (no
    validation: a container's stop timeout may be short); a second one stops at once."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignal:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, frame: Any) -> None:
        if self.received is not None:
            signal.signal(number, self._previous[number])
            signal.raise_signal(number)
            return
        self.received = signal.Signals(number).name
        logger.warning("%s: stopping after this step with a checkpoint", self.received)

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def train(config: Config, resume: bool = False, init_from: str | Path | None = None
          ) -> dict[str, Any]:
    with _StopSignal() as stop_signal:
        return _train(config, resume, init_from, stop_signal)


def _train(config: Config, resume: bool, init_from: str | Path | None,
           stop_signal: _StopSignal) -> dict[str, Any]:
    """Train ``config`` (from scratch, from ``{out_dir}/checkpoint_last.pt`` with ``resume``,
    or from the weights and step of the checkpoint ``init_from``, e.g. one recovered from a
    bundle) until ``max_steps``, ``max_minutes`` or early stopping; return the last validation
    metrics with the final step, the stop reason and a digest of the parameters."""
    from tqdm import tqdm

    from training.corpus import read_tsv
    from training.vocab import load_vocab

    started = time.monotonic()
    config = copy.deepcopy(config)
    tc = config.train
    rank, world_size, device, joined = _setup_distributed()
    master = rank == 0
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out_dir = Path(tc.out_dir)
    if master:
        out_dir.mkdir(parents=True, exist_ok=True)

    # -- data ------------------------------------------------------------------------------
    vocab_path = Path(f"{config.vocab.model_prefix}.model").resolve()
    sp = load_vocab(vocab_path)
    if config.model.vocab_size != sp.get_piece_size():
        logger.info("model.vocab_size set to %d, the size of %s", sp.get_piece_size(), vocab_path)
        config.model.vocab_size = sp.get_piece_size()
    data_dir = Path(config.data.out_dir)
    limit = config.model.max_positions
    if not master:
        dist.barrier()  # rank 0 writes the token caches first; the others then read them
    train_split = load_split(split_file(data_dir, "train"), vocab_path, limit)
    dev_split = load_split(split_file(data_dir, "dev"), vocab_path, limit)
    if master and world_size > 1:
        dist.barrier()
    references = [tgt for _, tgt in read_tsv(split_file(data_dir, "dev"))] if master else []
    if master:
        logger.info("train: %d pairs (%d longer than %d positions dropped); dev: %d pairs",
                    len(train_split), train_split.dropped, limit, len(dev_split))
    batches = BatchIterator(train_split, tc.batch_tokens, tc.seed, rank=rank,
                            world_size=world_size)

    # -- model, optimiser, schedule ----------------------------------------------------------
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    raw_model = init_model(config).to(device)
    torch.manual_seed(tc.seed + rank)  # same initial parameters, different dropout per rank
    autocast_dtype = resolve_precision(tc.precision, device)
    optimizer = torch.optim.Adam(raw_model.parameters(),
                                 lr=tc.lr_scale * config.model.d_model**-0.5,
                                 betas=(0.9, 0.98), eps=1e-9)
    last_path = out_dir / CHECKPOINT_LAST
    if resume and init_from:
        raise ValueError("--resume continues this run; --init-from starts one: choose one")
    ckpt, restart = None, 0  # restart: the step an --init-from run began at (0: none)
    if resume:
        if not last_path.is_file():
            raise FileNotFoundError(f"--resume: {last_path} does not exist")
        ckpt = load_checkpoint(last_path)
        restart = ckpt.get("restart_step", 0)
    elif init_from:
        ckpt = load_checkpoint(init_from)
        _check_same_vocab(Path(ckpt["vocab"]), vocab_path)
        restart = ckpt["step"]
    shape = _shape(dataclasses.asdict(config.model))
    if ckpt is not None and _shape(ckpt["model_config"]) != shape:
        raise ValueError(f"{init_from or last_path} was trained with model config "
                         f"{ckpt['model_config']}, not {dataclasses.asdict(config.model)}")
    lr_factor = functools.partial(restarted_factor, warmup=tc.warmup_steps, restart=restart,
                                  rewarm=REWARM_STEPS if restart else 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    scaler = torch.amp.GradScaler("cuda") if autocast_dtype == torch.float16 else None

    def autocast():
        if autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=autocast_dtype)

    step, patience = 0, 0
    best: list[tuple[float, str]] = []
    metrics: dict[str, float] = {}
    if ckpt is not None and not resume:
        raw_model.load_state_dict(ckpt["model"])
        step = restart
        scheduler.last_epoch = step  # LambdaLR began at step 0: move it to ``step``
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lr_factor(step)
        if master:
            logger.info("initialised from %s at step %d (fresh optimiser, %d-step ramp)",
                        init_from, step, REWARM_STEPS)
        del ckpt
    if resume:
        raw_model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        batches.load_state_dict(ckpt["data_state"])
        step, best = ckpt["step"], [tuple(b) for b in ckpt["best"]]
        patience, metrics = ckpt.get("patience", 0), ckpt.get("metrics") or {}
        rngs = ckpt["rng"].get("ranks")
        if rngs is not None and len(rngs) == world_size:
            set_rng_state(rngs[rank])
        else:
            if world_size > 1:
                logger.warning("resuming with %d ranks from a checkpoint of a different "
                               "world size: random streams are not continued exactly", world_size)
            set_rng_state(ckpt["rng"])
        del ckpt
        if master:
            logger.info("resumed from %s at step %d, data position %s", last_path, step,
                        batches.state_dict())
    model = raw_model
    if world_size > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(raw_model, device_ids=device_ids)

    def checkpoint(path_step: int) -> Path:
        """Write checkpoint_{step}.pt (+ checkpoint_last.pt) and prune old ones; rank 0 only."""
        path = out_dir / f"checkpoint_{path_step}.pt"
        save_atomic({
            "model": raw_model.state_dict(),
            "model_config": dataclasses.asdict(config.model),
            "config": dataclasses.asdict(config),
            "step": path_step,
            "vocab": str(vocab_path),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "data_state": batches.state_dict(),
            "rng": {**rng_state(), "ranks": all_rngs if world_size > 1 else None},
            "best": best,
            "patience": patience,
            "metrics": metrics,
            "restart_step": restart,
        }, path)
        link_atomic(path, last_path)
        for old in periodic_checkpoints(out_dir)[: -tc.keep_last or None]:
            old.unlink()
        return path

    # -- logging -------------------------------------------------------------------------------
    writer = _summary_writer(out_dir) if master else None
    progress = tqdm(total=tc.max_steps, initial=step, disable=not master, unit="step",
                    dynamic_ncols=True, mininterval=1.0)
    window = {"loss": 0.0, "steps": 0, "tokens": 0, "since": time.monotonic()}

    def log(record: dict[str, Any]) -> None:
        with open(out_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    writer.add_scalar(key, value, record["step"])

    # -- the loop ------------------------------------------------------------------------------
    model.train()
    stop_reason = "max_steps"
    all_rngs: list[Any] | None = None
    while step < tc.max_steps:
        micro_batches = [next(batches) for _ in range(tc.accumulate)]
        tokens = local_tokens = sum(b.target_tokens for b in micro_batches)
        if world_size > 1:
            counted = torch.tensor([tokens], device=device)
            dist.all_reduce(counted)
            tokens = int(counted.item())
        # Each token weighs the same however the step's tokens fall into micro-batches and
        # ranks: normalise by the global count (times world_size, which DDP's mean divides).
        step_loss = torch.zeros((), device=device)
        for i, micro in enumerate(micro_batches):
            batch = micro.to(device)
            sync = nullcontext() if world_size == 1 or i == len(micro_batches) - 1 \
                else model.no_sync()
            with sync:
                with autocast():
                    logits = model(batch.src, batch.tgt_input)
                loss = label_smoothed_nll(logits, batch.tgt_output, tc.label_smoothing)
                scaled = loss * (world_size / tokens)
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            step_loss += loss.detach()
        if scaler is not None:
            scaler.unscale_(optimizer)
        if tc.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.clip_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        lr = optimizer.param_groups[0]["lr"]  # the rate this step used
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        # -- bookkeeping (rank 0 decides, everybody follows) ---------------------------------
        step_loss = step_loss.item() / local_tokens  # this rank's mean, about the global one
        window["loss"] += step_loss
        window["steps"] += 1
        window["tokens"] += tokens
        elapsed = time.monotonic() - started
        signalled = stop_signal.received is not None
        time_up = _broadcast_flag(
            signalled or (tc.max_minutes > 0 and elapsed >= tc.max_minutes * 60), world_size, device
        )
        signalled = time_up and _broadcast_flag(signalled, world_size, device)
        final = time_up or step >= tc.max_steps
        if master:
            span = max(time.monotonic() - window["since"], 1e-9)
            progress.update(1)
            progress.set_postfix(loss=f"{step_loss:.3f}",
                                 lr=f"{lr:.2e}", tok_s=f"{window['tokens'] / span:.0f}",
                                 refresh=False)
        record: dict[str, Any] = {}
        if master and (step % tc.log_every == 0 or final):
            record = {"step": step, "loss": window["loss"] / window["steps"], "lr": lr,
                      "tokens_per_s": window["tokens"] / span, "elapsed": round(elapsed, 1)}
            window = {"loss": 0.0, "steps": 0, "tokens": 0, "since": time.monotonic()}
        validating = (step % tc.validate_every == 0 or final) and not signalled
        saving = validating or signalled or step % tc.checkpoint_every == 0
        if saving and world_size > 1:
            all_rngs = [None] * world_size
            dist.all_gather_object(all_rngs, rng_state())
        early_stop = False
        if master and validating:
            metrics = validate(raw_model, dev_split, references, sp, config, device, autocast)
            record = {"step": step, **record, **metrics}
            logger.info("step %d: %s", step, ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
            path = out_dir / f"checkpoint_{step}.pt"
            best_path = out_dir / f"best_{step}.pt"
            previous = best[0][0] if best else -math.inf
            best, dropped, is_best = update_best(best, metrics["bleu"], str(best_path),
                                                 tc.keep_best)
            patience = 0 if metrics["bleu"] > previous else patience + 1
            early_stop = 0 < tc.early_stop_patience <= patience
        if record:
            log(record)
        if master and saving:
            path = checkpoint(step)
            if validating:
                if is_best:
                    link_atomic(path, best_path)
                for old in dropped:
                    Path(old).unlink(missing_ok=True)
                if best:
                    link_atomic(Path(best[0][1]), out_dir / CHECKPOINT_BEST)
        if validating and _broadcast_flag(early_stop, world_size, device):
            stop_reason = f"early stop: no BLEU gain in {tc.early_stop_patience} validations"
            break
        if time_up:
            stop_reason = (f"{stop_signal.received or 'stop signal'} received" if signalled
                           else f"max_minutes ({tc.max_minutes}) reached")
            break
    progress.close()

    # -- the end -------------------------------------------------------------------------------
    if master:
        last_ones = periodic_checkpoints(out_dir)[-tc.average_last:] if tc.average_last else []
        if len(last_ones) >= 2:
            average_checkpoints(last_ones, out_dir / CHECKPOINT_AVG)
        logger.info("stopped at step %d (%s)", step, stop_reason)
        if writer is not None:
            writer.close()
    if world_size > 1:
        dist.barrier()
    # The DDP wrapper's reducer holds gloo work; freed only at interpreter exit, after the group
    # is gone, it can abort the process (std::terminate on a joinable thread, seen under load).
    del model
    gc.collect()
    if joined:
        dist.destroy_process_group()
    return {**metrics, "step": step, "stop_reason": stop_reason,
            "params_sha256": params_digest(raw_model)}
