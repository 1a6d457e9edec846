"""The training loop's promises: exact resume, DDP agreement, batching, checkpoint bookkeeping."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from training.batching import BatchIterator, load_split, make_batches, shard
from training.cli import main as cli_main
from training.config import BOS_ID, EOS_ID, PAD_ID
from training.train import (
    average_checkpoints,
    init_model,
    load_checkpoint,
    noam_factor,
    params_digest,
    periodic_checkpoints,
    restarted_factor,
    train,
    update_best,
)

# ---------------------------------------------------------------------------------------------
# Schedule and batches (no training)


def test_noam_schedule_warms_up_then_decays():
    warmup = 100
    factors = [noam_factor(s, warmup) for s in range(300)]  # LambdaLR counts from 0
    assert factors[0] == pytest.approx(1 * warmup**-1.5)  # optimiser step 1
    assert max(factors) == pytest.approx(warmup**-0.5)  # the peak is at step == warmup
    assert int(np.argmax(factors)) == warmup - 1
    assert factors[299] == pytest.approx(300**-0.5)


def test_batches_fit_the_budget_cover_everything_and_are_deterministic():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(2, 60, 3000), rng.integers(3, 60, 3000)
    budget = 500
    batches = make_batches(src, tgt, budget, seed=7, epoch=0, chunk_size=1000)
    for b in batches:
        assert len(b) == 1 or (len(b) * src[b].max() <= budget
                               and len(b) * (tgt[b].max() - 1) <= budget)
    assert sorted(np.concatenate(batches).tolist()) == list(range(3000))
    again = make_batches(src, tgt, budget, seed=7, epoch=0, chunk_size=1000)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    other = make_batches(src, tgt, budget, seed=7, epoch=1, chunk_size=1000)
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other, strict=False))
    # Length bucketing keeps padding low: well under 25% of the padded target tokens.
    padded = sum(len(b) * (tgt[b].max() - 1) for b in batches)
    assert (tgt - 1).sum() / padded > 0.75
    # Sharding: disjoint, equally many per rank.
    shards = [shard(batches, r, 3) for r in range(3)]
    assert len({len(s) for s in shards}) == 1
    seen = [i for s in shards for b in s for i in b.tolist()]
    assert len(seen) == len(set(seen))


def test_batch_iterator_position_resumes_exactly(make_train_config):
    config = make_train_config()
    split = load_split(f"{config.data.out_dir}/train.tsv", f"{config.vocab.model_prefix}.model",
                       config.model.max_positions)
    assert split.dropped == 0 and len(split) >= 50
    first = BatchIterator(split, 200, seed=3)
    for _ in range(first.batches(0).__len__() + 2):  # into the second epoch
        next(first)
    state = first.state_dict()
    assert state["epoch"] == 1 and state["index"] == 2
    second = BatchIterator(split, 200, seed=3)
    second.load_state_dict(state)
    for _ in range(5):
        a, b = next(first), next(second)
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_input, b.tgt_input)
    # Source ends with EOS, target input starts with BOS, output is input shifted by one.
    assert (a.tgt_input[:, 0] == BOS_ID).all()
    assert torch.equal(a.tgt_input[:, 1:], a.tgt_output[:, :-1])
    for tokens in (a.src, a.tgt_output):
        lengths = (tokens != PAD_ID).sum(1)
        assert (tokens[torch.arange(len(tokens)), lengths - 1] == EOS_ID).all()


# ---------------------------------------------------------------------------------------------
# Kill and resume


def test_kill_and_resume_gives_the_same_parameters(make_train_config):
    common = ("model.dropout=0.1", "train.batch_tokens=250", "train.accumulate=2",
              "train.checkpoint_every=3", "train.warmup_steps=4")
    n, k = 8, 5
    straight = make_train_config(*common, f"train.max_steps={n}", out="straight")
    result_straight = train(straight)

    interrupted = make_train_config(*common, f"train.max_steps={k}", out="interrupted")
    train(interrupted)  # "killed" after its checkpoint at step k
    at_k = load_checkpoint(Path(interrupted.train.out_dir) / "checkpoint_last.pt")
    assert at_k["step"] == k
    interrupted.train.max_steps = n
    result_resumed = train(interrupted, resume=True)

    a = load_checkpoint(Path(straight.train.out_dir) / "checkpoint_last.pt")
    b = load_checkpoint(Path(interrupted.train.out_dir) / "checkpoint_last.pt")
    assert a["step"] == b["step"] == n
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert result_straight["params_sha256"] == result_resumed["params_sha256"]
    assert a["data_state"] == b["data_state"]
    # The position saved at k is the one after k steps of `accumulate` batches each, and the
    # run crossed into a later epoch (so the epoch turnover is part of what was checked).
    split = load_split(f"{straight.data.out_dir}/train.tsv",
                       f"{straight.vocab.model_prefix}.model", straight.model.max_positions)
    replay = BatchIterator(split, 250, seed=straight.train.seed)
    for _ in range(2 * k):
        next(replay)
    assert at_k["data_state"] == replay.state_dict()
    assert a["data_state"]["epoch"] >= 1
    # Dropout was really on: a run without it ends elsewhere.
    assert a["config"]["model"]["dropout"] == 0.1
    for key in ("model", "model_config", "config", "step", "vocab", "optimizer", "scheduler",
                "scaler", "data_state", "rng", "best", "metrics"):
        assert key in a, key
    assert Path(a["vocab"]).is_absolute() and Path(a["vocab"]).is_file()
    assert set(a["metrics"]) >= {"dev_loss", "bleu", "chrf"}


# ---------------------------------------------------------------------------------------------
# DDP: two CPU processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world_size: int, port: int, config, result_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    result = train(config)
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(result))


def test_ddp_two_processes_keep_identical_parameters(make_train_config, tmp_path):
    config = make_train_config("train.max_steps=3", "train.batch_tokens=300",
                               "train.warmup_steps=2", "model.dropout=0.1", out="ddp")
    torch.multiprocessing.spawn(_ddp_worker, args=(2, _free_port(), config, str(tmp_path)),
                                nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0]["step"] == results[1]["step"] == 3
    assert results[0]["params_sha256"] == results[1]["params_sha256"]
    assert results[0]["params_sha256"] != params_digest(init_model(config))
    checkpoint = load_checkpoint(Path(config.train.out_dir) / "checkpoint_last.pt")
    assert len(checkpoint["rng"]["ranks"]) == 2  # each rank's random state, for resuming


# ---------------------------------------------------------------------------------------------
# Checkpoint files


def test_average_checkpoints(tmp_path):
    paths = []
    for i, value in enumerate([1.0, 2.0, 6.0]):
        path = tmp_path / f"checkpoint_{i}.pt"
        torch.save({"model": {"w": torch.full((2, 2), value), "count": torch.tensor(i)},
                    "model_config": {"d_model": 2}, "config": {}, "step": i, "vocab": "v.model",
                    "optimizer": {"state": {}}, "metrics": {"bleu": float(i)}}, path)
        paths.append(path)
    out = average_checkpoints(paths, tmp_path / "avg.pt")
    averaged = load_checkpoint(out)
    assert torch.equal(averaged["model"]["w"], torch.full((2, 2), 3.0))
    assert averaged["model"]["count"].item() == 2  # not averaged: taken from the last
    assert averaged["step"] == 2 and averaged["vocab"] == "v.model"
    assert "optimizer" not in averaged and len(averaged["averaged_from"]) == 3
    # The same through the command line, picking the last two of a directory.
    cli_main(["average", str(tmp_path / "avg2.pt"), "--last", "2", "--dir", str(tmp_path)])
    assert torch.equal(load_checkpoint(tmp_path / "avg2.pt")["model"]["w"],
                       torch.full((2, 2), 4.0))


def test_update_best_keeps_the_n_best():
    best: list[tuple[float, str]] = []
    removed_all = []
    for step, bleu in enumerate([5.0, 9.0, 7.0, 3.0, 9.5, 8.0]):
        best, removed, is_best = update_best(best, bleu, f"best_{step}.pt", keep=3)
        removed_all += removed
        assert len(best) <= 3
    assert best == [(9.5, "best_4.pt"), (9.0, "best_1.pt"), (8.0, "best_5.pt")]
    assert sorted(removed_all) == ["best_0.pt", "best_2.pt", "best_3.pt"]
    _, removed, is_best = update_best(best, 1.0, "best_9.pt", keep=3)
    assert removed == ["best_9.pt"] and not is_best


def test_checkpoint_files_on_disk(make_train_config):
    config = make_train_config("train.max_steps=6", "train.validate_every=2",
                               "train.checkpoint_every=1", "train.keep_last=3",
                               "train.keep_best=2", "train.average_last=2",
                               "train.log_every=2")
    result = train(config)
    out = Path(config.train.out_dir)
    assert [p.name for p in periodic_checkpoints(out)] == [f"checkpoint_{s}.pt" for s in (4, 5, 6)]
    best_files = sorted(out.glob("best_*.pt"))
    last = load_checkpoint(out / "checkpoint_last.pt")
    assert len(best_files) == len(last["best"]) == 2
    assert {Path(p).name for _, p in last["best"]} == {p.name for p in best_files}
    assert (out / "checkpoint_best.pt").stat().st_ino == Path(last["best"][0][1]).stat().st_ino
    assert (out / "checkpoint_last.pt").stat().st_ino == (out / "checkpoint_6.pt").stat().st_ino
    assert load_checkpoint(out / "checkpoint_avg.pt")["averaged_from"][-1].endswith(
        "checkpoint_6.pt")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6]
    assert {"loss", "lr", "tokens_per_s", "elapsed", "dev_loss", "bleu", "chrf"} <= set(records[-1])
    assert result["step"] == 6 and result["bleu"] == records[-1]["bleu"]


def test_init_from_continues_a_checkpoint_with_a_fresh_optimiser(make_train_config, tmp_path):
    """``--init-from`` (e.g. a checkpoint recovered from a bundle): training goes on from its
    weights and step, the rate ramps up again, and an interrupted continuation resumes
    exactly like any other run."""
    common = ("train.warmup_steps=4", "train.log_every=1", "train.checkpoint_every=2")
    first = make_train_config(*common, "train.max_steps=4", out="first")
    train(first)
    source = Path(first.train.out_dir) / "checkpoint_last.pt"
    start = load_checkpoint(source)["model"]

    straight = make_train_config(*common, "train.max_steps=8", out="straight")
    train(straight, init_from=source)
    out = Path(straight.train.out_dir)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [5, 6, 7, 8]
    base = straight.train.lr_scale * straight.model.d_model**-0.5
    for r in records:  # LambdaLR counts optimiser steps from 0: step s uses factor(s - 1)
        assert r["lr"] == pytest.approx(base * restarted_factor(r["step"] - 1, 4, 4, 200))
    assert records[0]["lr"] == pytest.approx(base * noam_factor(4, 4) / 200)
    ended = load_checkpoint(out / "checkpoint_last.pt")
    fresh = init_model(straight).state_dict()
    moved = sum((ended["model"][k] - start[k]).abs().sum().item() for k in start)
    from_scratch = sum((ended["model"][k] - fresh[k]).abs().sum().item() for k in start)
    assert 0 < moved < from_scratch / 10

    stopped = make_train_config(*common, "train.max_steps=6", out="stopped")
    train(stopped, init_from=source)
    stopped.train.max_steps = 8
    train(stopped, resume=True)
    resumed = load_checkpoint(Path(stopped.train.out_dir) / "checkpoint_last.pt")
    for name, tensor in ended["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name

    with pytest.raises(ValueError, match="choose one"):
        train(stopped, resume=True, init_from=source)
    alien = load_checkpoint(source)
    other_vocab = tmp_path / "other.model"
    other_vocab.write_bytes(Path(alien["vocab"]).read_bytes() + b"\0")
    alien["vocab"] = str(other_vocab)
    torch.save(alien, tmp_path / "alien.pt")
    with pytest.raises(ValueError, match=r"vocabulary .* differs"):
        train(make_train_config(*common, "train.max_steps=6", out="alien"),
              init_from=tmp_path / "alien.pt")


def test_init_from_may_change_dropout_but_not_the_shape(make_train_config):
    """A continuation may train with another dropout (a recipe comparison from the same weights);
    weights of another shape are refused by name, not loaded half."""
    common = ("train.warmup_steps=4", "train.checkpoint_every=2")
    first = make_train_config(*common, "train.max_steps=2", out="first")
    train(first)
    source = Path(first.train.out_dir) / "checkpoint_last.pt"

    wetter = make_train_config(*common, "train.max_steps=4", "model.dropout=0.3", out="wetter")
    assert train(wetter, init_from=source)["step"] == 4
    ended = load_checkpoint(Path(wetter.train.out_dir) / "checkpoint_last.pt")
    assert ended["model_config"]["dropout"] == 0.3

    wider = make_train_config(*common, "train.max_steps=4",
                              f"model.d_ff={first.model.d_ff * 2}", out="wider")
    with pytest.raises(ValueError, match="was trained with model config"):
        train(wider, init_from=source)


def test_max_minutes_stops_with_a_checkpoint(make_train_config):
    config = make_train_config("train.max_steps=1000", "train.max_minutes=0.0001")
    result = train(config)
    assert result["step"] == 1 and "max_minutes" in result["stop_reason"]
    assert load_checkpoint(Path(config.train.out_dir) / "checkpoint_last.pt")["step"] == 1


def test_a_stop_signal_ends_training_with_a_checkpoint(make_train_config):
    """SIGTERM (docker stop, torchrun's shutdown) mid-run: stop after the step, checkpoint,
    return normally, and leave the process's own signal handling as it was."""
    import signal
    import threading
    import time

    config = make_train_config("train.max_steps=100000", "train.log_every=1")
    metrics_file = Path(config.train.out_dir) / "metrics.jsonl"
    before = signal.getsignal(signal.SIGTERM)

    def stop_once_training() -> None:
        while not metrics_file.is_file() or not metrics_file.read_text().strip():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_once_training, daemon=True).start()
    result = train(config)
    assert result["stop_reason"] == "SIGTERM received"
    assert 1 <= result["step"] < 100000
    last = load_checkpoint(Path(config.train.out_dir) / "checkpoint_last.pt")
    assert last["step"] == result["step"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_split_is_found_plain_or_compressed(tmp_path):
    import lzma

    from training.batching import split_file

    with pytest.raises(FileNotFoundError, match=r"train\.tsv"):
        split_file(tmp_path, "train")
    with lzma.open(tmp_path / "train.tsv.xz", "wt", encoding="utf-8") as f:
        f.write("Hello.\tHallo.\n")
    assert split_file(tmp_path, "train") == tmp_path / "train.tsv.xz"
    (tmp_path / "train.tsv").write_text("Hi.\tHi.\n", encoding="utf-8")
    assert split_file(tmp_path, "train") == tmp_path / "train.tsv"  # the plain file wins


def test_a_checkpoint_from_before_a_model_field_existed_continues() -> None:
    """A checkpoint saved before a field was added to ModelConfig (its default is what it was
    trained with) can be resumed or continued: the shapes compare with defaults filled in."""
    import dataclasses

    from training.config import ModelConfig
    from training.train import _shape

    current = dataclasses.asdict(ModelConfig.preset("tiny"))
    older = {k: v for k, v in current.items() if k != "max_relative_positions"}
    assert _shape(older) == _shape(current)
    assert _shape({**older, "d_model": 32}) != _shape(current)
