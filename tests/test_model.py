"""The Transformer's concepts checked one by one, and the tiny preset memorising a fixture."""

from __future__ import annotations

import pytest
import torch

from training.batching import collate, load_split
from training.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from training.model import Transformer, sinusoidal_table
from training.train import load_checkpoint, train

VOCAB = 50


def small_model(pre_norm: bool, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=VOCAB, pre_norm=pre_norm))
    return model.eval()


def test_positional_encoding_worked_example():
    # PE(1) for d=4: sin(1), cos(1), sin(1/10000^(2/4)), cos(1/100)
    table = sinusoidal_table(max_positions=3, d_model=4)
    expected = torch.tensor([0.8415, 0.5403, 0.0099998, 0.99995])
    torch.testing.assert_close(table[1], expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(table[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_padding_is_invisible(pre_norm: bool):
    model = small_model(pre_norm)
    src = torch.tensor([[5, 6, 7, EOS_ID, PAD_ID, PAD_ID], [8, 9, 10, 11, 12, EOS_ID]])
    tgt = torch.tensor([[BOS_ID, 13, 14, 15], [BOS_ID, 16, 17, 18]])
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        out = model.decode(tgt, memory, src_mask)
        # Whatever sits at the padded positions (here: noise instead of the PAD encoding)...
        noisy = memory.clone()
        noisy[0, 4:] = torch.randn(2, memory.size(-1)) * 10
        out_noisy = model.decode(tgt, noisy, src_mask)
        # ...and however much padding there is, the decoder output is the same.
        alone = model(src[:1, :4], tgt[:1])
        padded = model(src[:1], tgt[:1])
    torch.testing.assert_close(out_noisy, out, atol=1e-6, rtol=0)
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(noisy, memory)


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_cannot_see_the_future(pre_norm: bool):
    model = small_model(pre_norm)
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    tgt = torch.tensor([[BOS_ID, 13, 14, 15, 16]])
    changed = tgt.clone()
    changed[0, 3] = 40
    with torch.no_grad():
        before = model(src, tgt)
        after = model(src, changed)
    torch.testing.assert_close(after[:, :3], before[:, :3], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, 3:], before[:, 3:])  # the mask is not simply "see nothing"


def test_embeddings_are_tied():
    model = small_model(pre_norm=False)
    table = model.embeddings.lut.weight
    big = [name for name, p in model.named_parameters() if p.shape == table.shape]
    assert big == ["embeddings.lut.weight"]  # one matrix: source, target and generator
    x = torch.randn(2, 3, model.config.d_model)
    torch.testing.assert_close(model.generator(x), x @ table.T)
    # The generator's gradient reaches the shared table, also rows never looked up.
    model(torch.tensor([[5, EOS_ID]]), torch.tensor([[BOS_ID, 7]]))[0, -1, 30].backward()
    assert table.grad is not None and table.grad[30].abs().sum() > 0


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_cached_decoding_matches_teacher_forcing(pre_norm: bool):
    """decode_step (what the ONNX decoder runs) reproduces forward() position by position."""
    model = small_model(pre_norm, seed=3)
    src = torch.tensor([[5, 6, 7, EOS_ID, PAD_ID], [8, 9, 10, 11, EOS_ID]])
    tgt = torch.tensor([[BOS_ID, 13, 14, 15], [BOS_ID, 16, 17, 18]])
    with torch.no_grad():
        logits = model(src, tgt)
        # The step never proposes PAD or BOS (model.never_generate); otherwise the same maths.
        logits = logits.masked_fill(model.never_generate, torch.finfo(logits.dtype).min)
        expected = torch.log_softmax(logits, dim=-1)
        cross_keys, cross_values, src_mask = model.encode_cross(src)
        layers, batch, heads, _, head_dim = cross_keys.shape
        keys = values = cross_keys.new_zeros(layers, batch, heads, 0, head_dim)
        for t in range(tgt.size(1)):
            log_probs, k, v = model.decode_step(
                tgt[:, t],
                torch.full((batch,), t),
                keys,
                values,
                torch.ones(batch, t + 1, dtype=torch.bool),
                cross_keys,
                cross_values,
                src_mask,
            )
            keys, values = k, v
            torch.testing.assert_close(log_probs, expected[:, t], atol=1e-5, rtol=1e-5)


def test_tiny_preset_overfits_the_fixture(make_train_config):
    """The whole loop (batches, schedule, optimiser, checkpoints) can memorise 64 pairs:
    greedy decoding then reproduces every target exactly."""
    config = make_train_config(
        "train.lr_scale=1.0",
        "train.warmup_steps=50",
        "train.label_smoothing=0.0",
        "train.clip_norm=0.0",
    )
    split = load_split(
        f"{config.data.out_dir}/train.tsv",
        f"{config.vocab.model_prefix}.model",
        config.model.max_positions,
    )
    batch = collate(split, list(range(len(split))))
    targets = [
        batch.tgt_output[i][batch.tgt_output[i] != PAD_ID][:-1].tolist() for i in range(len(split))
    ]
    exact = 0
    # Exact at 150-400 on the machines seen so far, later on some (float rounding differs by
    # CPU); resume until it is.
    for steps in (150, 200, 300, 400, 500, 600, 800):
        config.train.max_steps = steps
        train(config, resume=steps > 150)
        checkpoint = load_checkpoint(f"{config.train.out_dir}/checkpoint_last.pt")
        model = Transformer(ModelConfig(**checkpoint["model_config"]))
        model.load_state_dict(checkpoint["model"])
        decoded = model.eval().greedy_decode(batch.src, 60, BOS_ID, EOS_ID)
        exact = sum(hyp == ref for hyp, ref in zip(decoded, targets, strict=True))
        if exact == len(targets):
            break
    assert len(targets) >= 50
    assert exact == len(targets)
