"""The onnxruntime engine: it reproduces PyTorch, search is right, batching changes nothing."""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from service.batch import Hole, SourceTooLong, length_groups
from service.engine import Engine, available_cpus
from service.search import (
    NEG_INF,
    DecodeOptions,
    Sentence,
    ban_repeats,
    beam_rows,
    repeated_ngram_ends,
    top_candidates,
)
from training.config import BOS_ID, EOS_ID, PAD_ID
from training.corpus import read_tsv
from training.export import load_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"


@pytest.fixture(scope="module", params=["host_cache", "device_cache"])
def engine(tiny_bundle: Path, request: pytest.FixtureRequest) -> Engine:
    """Batches with caches in numpy buffers, and in OrtValues updated by onnxruntime graphs
    (service.device_cache, which CUDA runs; here on the CPU provider): every test of the
    running batch holds for both."""
    return Engine(tiny_bundle, device="cpu", threads=1,
                  device_cache=request.param == "device_cache")


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    return read_tsv(FIXTURE)


def _padded(rows: list[list[int]]) -> torch.Tensor:
    batch = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = torch.tensor(row)
    return batch


def test_translates_what_it_learned(engine: Engine, pairs) -> None:
    sources, targets = zip(*pairs[:16], strict=True)
    assert [t.text for t in engine.translate(list(sources))] == list(targets)


def test_greedy_equals_pytorch_and_full_prefix_recomputation(engine, pairs, tiny_checkpoint):
    model, _ = load_checkpoint(tiny_checkpoint)
    sources = [s for s, _ in pairs[:12]] + ["An unseen sentence about green ideas."]
    ours = [t.hypotheses[0].token_ids for t in engine.translate(sources, max_length=40)]
    src = _padded([engine.tokenize(s) for s in sources])
    cached = model.greedy_decode(src, 40, BOS_ID, EOS_ID)
    assert ours == cached
    # No cache at all: rerun the whole decoder over the prefix at every step.
    with torch.no_grad():
        for row, expected in zip(src, ours, strict=True):
            prefix = [BOS_ID]
            for _ in range(40):
                logits = model(row[None], torch.tensor([prefix]))[0, -1]
                logits[[PAD_ID, BOS_ID]] = float("-inf")
                token = int(logits.argmax())
                if token == EOS_ID:
                    break
                prefix.append(token)
            assert prefix[1:] == expected


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_batch_invariance_greedy_and_beam(tiny_bundle: Path, variant: str, pairs) -> None:
    # Two threads: an int8 sentence alone then steps on the one-thread decoder session, the
    # batch of 32 on the two-thread one, and the two must agree to the bit.
    engine = Engine(tiny_bundle, device="cpu", threads=2, variant=variant)
    assert (engine.decoder_small is not engine.decoder) == (variant == "int8")
    # 32 sentences of mixed length, some unseen, some repeated.
    sources = [s for s, _ in pairs[:24]] + [
        "Hello.", "The cat.", "Please close the window and the door of the garden.",
        "Where is the printer?", "I have a dog, a cat and a small brother in Berlin.",
        "Yes.", "The children are reading a book about coffee.", pairs[0][0],
    ]
    assert len(sources) == 32
    for options in (
        dict(beam_size=1),
        dict(beam_size=4, num_hypotheses=2),
        dict(beam_size=1, no_repeat_ngram_size=1),
        dict(beam_size=3, no_repeat_ngram_size=2),
    ):
        batched = engine.translate(sources, **options)
        for source, translation in zip(sources, batched, strict=True):
            alone = engine.translate([source], **options)[0]
            assert [h.token_ids for h in alone.hypotheses] == [
                h.token_ids for h in translation.hypotheses
            ]


def test_the_memory_arena_is_kept_only_when_asked_and_changes_no_output(
    tiny_bundle: Path, engine: Engine, pairs
) -> None:
    assert not engine.decoder.get_session_options().enable_cpu_mem_arena
    kept = Engine(tiny_bundle, device="cpu", threads=1, memory_arena=True)
    assert kept.decoder.get_session_options().enable_cpu_mem_arena
    assert kept.encoder.get_session_options().enable_cpu_mem_arena
    sources = [s for s, _ in pairs[:16]]
    want = [t.hypotheses[0].token_ids for t in engine.translate(sources)]
    assert [t.hypotheses[0].token_ids for t in kept.translate(sources)] == want


def test_workers_translate_exactly_as_one(tiny_bundle: Path, engine: Engine, pairs) -> None:
    two = Engine(tiny_bundle, device="cpu", threads=2, workers=2)
    assert len(two.replicas) == 2 and two.threads == 1
    # One-thread replicas share the sessions (the weights are held once), never a batch.
    assert two.replicas[1].decoder is two.decoder
    sources = [s for s, _ in pairs[:20]]
    for options in (dict(beam_size=1), dict(beam_size=3, num_hypotheses=2)):
        want = engine.translate(sources, **options)
        got = two.translate(sources, max_batch_rows=6, **options)  # several batches to share
        for a, b in zip(got, want, strict=True):
            assert [h.token_ids for h in a.hypotheses] == [h.token_ids for h in b.hypotheses]
            assert a.score == pytest.approx(b.score, abs=1e-5)
    # workers=0 picks them: two one-thread replicas on a 2-thread CPU budget, one on a single.
    auto = Engine(tiny_bundle, device="cpu", threads=2, workers=0)
    assert [replica.threads for replica in auto.replicas] == [1, 1]
    assert len(Engine(tiny_bundle, device="cpu", threads=1, workers=0).replicas) == 1
    # Every thread asked for is used, none twice.
    uneven = Engine(tiny_bundle, device="cpu", threads=3, workers=2)
    assert [replica.threads for replica in uneven.replicas] == [2, 1]
    assert uneven.replicas[1].decoder is not uneven.decoder  # each its own intra-op pool


def test_one_sentence_calls_share_a_batch_yet_never_each_others_rows(
    engine: Engine, pairs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls of a few rows decode in the replica's spare batch. A call that fails midway
    (the decoder raising at its third step) must leave none of its rows to the next call, and
    calls from several threads at once must not decode in the same batch."""
    sources = [s for s, _ in pairs[:8]] + ["Where is the printer?", "Yes."]
    want = {s: engine.translate([s], beam_size=2)[0].hypotheses[0].token_ids for s in sources}

    real, calls = engine.run_decoder, 0

    def failing(session, binding) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("the decoder failed")
        real(session, binding)

    monkeypatch.setattr(engine, "run_decoder", failing)
    # The longest translation: left behind, it would outlast the next call's sentence.
    by_length = sorted(sources, key=lambda s: len(want[s]))
    with pytest.raises(RuntimeError, match="the decoder failed"):
        engine.translate([by_length[-1]], beam_size=2)
    monkeypatch.undo()
    assert all(engine.translate([s], beam_size=2)[0].hypotheses[0].token_ids == want[s]
               for s in by_length)

    def translate_all(offset: int) -> bool:
        order = sources[offset:] + sources[:offset]
        return all(engine.translate([s], beam_size=2)[0].hypotheses[0].token_ids == want[s]
                   for s in order * 3)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(translate_all, range(4)))


def test_beam_one_is_greedy_and_beam_finds_at_least_greedy_score(engine, pairs) -> None:
    sources = [s for s, _ in pairs[:10]] + ["Green ideas sleep furiously in the garden."]
    greedy = engine.translate(sources)
    beam1 = engine.translate(sources, beam_size=1)
    assert [t.hypotheses[0].token_ids for t in greedy] == [
        t.hypotheses[0].token_ids for t in beam1
    ]
    beam4 = engine.translate(sources, beam_size=4)
    for g, b in zip(greedy, beam4, strict=True):
        assert b.score >= g.score - 1e-6


def test_the_length_penalty_ranks_while_the_log_probability_stays_the_models(engine) -> None:
    """A hypothesis's score is log P / length ** length_penalty; log P itself (what the API's
    mean log-probability per token comes from) is the model's, whatever the penalty."""
    sentences = ["The weather is nice.", "My brother reads a book in the garden."]
    by_penalty = {}
    for penalty in (1.0, 1.6):
        translations = engine.translate(
            sentences, beam_size=4, num_hypotheses=4, length_penalty=penalty, max_length=12
        )
        for translation in translations:
            for h in translation.hypotheses:
                # EOS counts where it ended the hypothesis; one cut at max_length has none.
                assert h.length == len(h.token_ids) + (len(h.token_ids) < 12)
                assert h.score == pytest.approx(h.log_prob / h.length**penalty, rel=1e-9)
                by_penalty.setdefault(tuple(h.token_ids), []).append(h.log_prob)
    shared = [values for values in by_penalty.values() if len(values) == 2]
    assert shared  # hypotheses both searches kept
    for with_one, with_other in shared:
        assert with_other == pytest.approx(with_one, abs=1e-5)


def test_n_best_sorted_distinct_and_counted(engine: Engine) -> None:
    sentences = ["The weather is nice.", "My brother reads a book in the garden."]
    for translation in engine.translate(sentences, beam_size=5, num_hypotheses=4):
        scores = [h.score for h in translation.hypotheses]
        assert len(scores) == 4
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.token_ids) for h in translation.hypotheses}) == 4
        assert all(h.text == engine.detokenize(h.token_ids) for h in translation.hypotheses)


def test_max_length_is_honoured(engine: Engine, pairs) -> None:
    for beam in (1, 3):
        for translation in engine.translate([s for s, _ in pairs[:6]], max_length=2,
                                            beam_size=beam):
            assert all(len(h.token_ids) <= 2 for h in translation.hypotheses)
    # Relative cap: a one-word source cannot produce more than ratio * len + 10 tokens.
    translation = engine.translate(["Yes"], max_length=200, max_length_ratio=0.5)[0]
    assert len(translation.hypotheses[0].token_ids) <= int(0.5 * len(engine.tokenize("Yes"))) + 10


def test_sources_beyond_the_positions_are_refused_not_cut(engine: Engine) -> None:
    limit = engine.max_source_tokens
    too_long = " ".join(["garden"] * (limit + 5))
    assert len(engine.tokenize(too_long)) > limit
    with pytest.raises(SourceTooLong, match=f"at most {limit}"):
        engine.translate(["Hello.", too_long])
    # Just within the limit works, and the output never exceeds the target positions.
    words = []
    while len(engine.tokenize(" ".join([*words, "garden"]))) <= limit:
        words.append("garden")
    longest = engine.translate([" ".join(words)], max_length=10_000, max_length_ratio=100)[0]
    assert len(longest.hypotheses[0].token_ids) <= engine.bundle.max_positions - 1


def test_sentences_joining_a_running_batch_get_their_own_answer(engine: Engine, pairs) -> None:
    """Continuous batching: sentences added between steps, one removed midway."""
    options = DecodeOptions()
    beam = DecodeOptions(beam_size=3)
    expected = {i: engine.translate([s])[0].text for i, (s, _) in enumerate(pairs[:8])}
    batch = engine.new_batch()
    results = {}
    batch.add("dropped", engine.tokenize(pairs[9][0]), options)
    for step in range(200):
        if step < 8:
            batch.add(step, engine.tokenize(pairs[step][0]), beam if step % 3 == 0 else options)
        if step == 2:
            batch.remove("dropped")
        results.update(batch.step())
        if step >= 8 and not len(batch):
            break
    assert "dropped" not in results
    assert {k: v.text for k, v in results.items() if k % 3} == {
        k: v for k, v in expected.items() if k % 3
    }
    beam_expected = {i: engine.translate([pairs[i][0]], beam_size=3)[0].text for i in (0, 3, 6)}
    assert {k: results[k].text for k in (0, 3, 6)} == beam_expected


def test_finished_rows_are_reused_by_sentences_of_the_same_width(engine: Engine, pairs) -> None:
    """A sentence joining after one of its width left takes over that sentence's rows."""
    sources = [s for s, _ in pairs[:12]]
    expected = [t.text for t in engine.translate(sources, max_batch_rows=1)]
    batch = engine.new_batch()
    results: dict = {}
    pending = list(range(len(sources)))
    reused = 0
    while pending or len(batch):
        while pending and batch.num_rows < 4:
            index = pending.pop(0)
            batch.add(index, engine.tokenize(sources[index]), DecodeOptions())
        holes = any(isinstance(s, Hole) for s in batch.sentences)
        rows_before = len(batch.tokens)
        results.update(batch.step())
        reused += holes and len(batch.tokens) >= rows_before  # refilled, not compacted
    assert [results[i].text for i in range(len(sources))] == expected
    assert reused


def test_a_lone_sentence_after_another_takes_its_rows_as_they_are(engine: Engine, pairs) -> None:
    """One sentence at a time (a lone client, one-sentence calls): each newcomer fills the
    drained batch's hole of its width, sources long and short in turn, and the rows keep
    their buffers and bindings (the cache's version stays) yet every answer is its own."""
    sources = [" ".join(s for s, _ in pairs[:3]), pairs[3][0], "Yes.", pairs[4][0] * 2]
    for options in (DecodeOptions(), DecodeOptions(beam_size=2, no_repeat_ngram_size=2)):
        expected = [t.text for t in engine.translate(sources, max_batch_rows=1,
                                                     **vars(options))]
        batch = engine.new_batch()
        versions = []
        for index, source in enumerate(sources):
            batch.add(index, engine.tokenize(source), options)
            results: dict = {}
            while len(batch):
                results.update(batch.step())
            assert results[index].text == expected[index]
            versions.append(batch.cache.version)
        assert len(set(versions[1:])) == 1  # rebound for none after the first (widest) source


def test_int8_variant_translates(tiny_bundle: Path, pairs) -> None:
    int8 = Engine(tiny_bundle, device="cpu", threads=1, variant="int8")
    assert int8.variant == "int8"
    sources, targets = zip(*pairs[:16], strict=True)
    translations = [t.text for t in int8.translate(list(sources))]
    # Static int8 keeps nearly all of what the float model memorised.
    assert sum(t == r for t, r in zip(translations, targets, strict=True)) >= 14


def test_cuda_defaults_to_fp32_cpu_to_the_manifests_choice(tiny_bundle: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch):
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["default_variant"] = "int8"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert Engine(bundle, device="cpu", threads=1).variant == "int8"
    assert Engine(bundle, device="cpu", threads=1, variant="fp32").variant == "fp32"
    # Only the provider choice is faked: this onnxruntime build has no CUDA and falls back.
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr("onnxruntime.get_available_providers", lambda: available)
    monkeypatch.setattr("service.engine.cuda_runs", lambda: True)
    assert Engine(bundle, device="cuda", threads=1).variant == "fp32"


def test_thread_default_honours_a_container_cpu_quota(tmp_path: Path) -> None:
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))  # no cpu.max: the mask
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # --cpus 0.5
    assert available_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # --cpus 1.5
    assert available_cpus(tmp_path) == min(2, len(os.sched_getaffinity(0)))


def test_bad_options_are_rejected(engine: Engine) -> None:
    with pytest.raises(ValueError, match="num_hypotheses"):
        engine.translate(["Hello."], beam_size=2, num_hypotheses=3)
    with pytest.raises(TypeError, match="unknown option"):
        engine.translate(["Hello."], beam=2)
    with pytest.raises(ValueError, match="device"):
        Engine(engine.bundle.dir, device="tpu")


def test_input_is_normalised_as_the_training_corpus_was(engine: Engine, pairs) -> None:
    source = pairs[0][0]
    decomposed = source.replace("a", "a\u0308")  # NFD umlauts must not change the tokens
    assert engine.tokenize(decomposed) == engine.tokenize(source.replace("a", "ä"))
    noisy = "  " + source.replace(" ", " \u200b\t ") + "\x00 "
    assert engine.tokenize(noisy) == engine.tokenize(source)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 20.0])  # peaked to nearly flat
def test_beam_candidates_are_the_exact_top_of_the_whole_block(temperature: float) -> None:
    rng = np.random.default_rng(int(temperature * 10))
    for trial in range(50):
        width, vocab = int(rng.integers(1, 6)), int(rng.integers(5, 300))
        logits = rng.standard_normal((width, vocab)) * temperature
        log_probs = (logits - np.log(np.exp(logits).sum(1, keepdims=True))).astype(np.float32)
        if trial % 3 == 0:  # repeated values: ties resolve by beam, then token
            log_probs = np.round(log_probs, 1)
        scores = rng.uniform(-20, 0, width)
        if trial % 4 == 0:
            scores[1:] = NEG_INF  # the first step: only beam 0 may expand
        count = min(2 * width, log_probs.size - 1)
        beams, tokens, totals = top_candidates(scores, log_probs, count)

        flat = (scores[:, None] + log_probs.astype(np.float64)).ravel()
        live = np.flatnonzero(flat > NEG_INF / 2)
        expected = live[np.lexsort((live, -flat[live]))][:count]
        assert [b * vocab + t for b, t in zip(beams, tokens, strict=True)] == expected.tolist()
        assert totals == flat[expected].tolist()


def test_new_beams_keep_their_parents_rows_and_ties_follow_rank_not_row() -> None:
    # A parent's first child stays in its row; a second child takes a row whose beam left
    # no child: one copy of history instead of three.
    assert beam_rows([0, 0, 1, 2], 4) == [0, 3, 1, 2]
    assert beam_rows([1, 0], 2) == [1, 0]  # a swap moves nothing
    assert beam_rows([2, 2, 2], 4) == [2, 0, 1]
    # Rows no longer in rank order: equal totals go to the better-ranked beam, as they did
    # when rows were ranks.
    scores = np.array([-1.0, -1.0])
    log_probs = np.log(np.full((2, 4), 0.25, np.float32))
    beams, tokens, _ = top_candidates(scores, log_probs, 3, ranks=[1, 0])
    assert (beams, tokens) == ([1, 1, 1], [0, 1, 2])
    beams, tokens, _ = top_candidates(scores, log_probs, 3)
    assert (beams, tokens) == ([0, 0, 0], [0, 1, 2])


def test_beam_candidates_over_a_flat_large_vocabulary_are_exact() -> None:
    """Nearly flat rows of an Opus-MT-sized vocabulary put tens of thousands of entries within
    any margin: the partition's cut-off must give the same exact top."""
    rng = np.random.default_rng(7)
    for width, uneven in ((1, False), (4, False), (4, True)):
        logits = rng.standard_normal((width, 58101)) * 0.1
        if uneven:  # a high plateau the sampled entries miss: the sample's cut-off admits it all
            plateau = np.arange(58101) % 16 != 0
            plateau[8000:] = False
            logits[:, plateau] += 20.0
        log_probs = (logits - np.log(np.exp(logits).sum(1, keepdims=True))).astype(np.float32)
        scores = rng.uniform(-2, 0, width)
        count = 2 * width
        beams, tokens, totals = top_candidates(scores, log_probs, count)
        flat = (scores[:, None] + log_probs.astype(np.float64)).ravel()
        expected = np.lexsort((np.arange(flat.size), -flat))[:count]
        assert [b * 58101 + t for b, t in zip(beams, tokens, strict=True)] == expected.tolist()
        assert totals == flat[expected].tolist()


def test_length_groups_split_only_where_the_padding_saved_outweighs_a_call() -> None:
    assert length_groups([20] * 10) == [slice(0, 10)]
    assert length_groups([]) == [slice(0, 0)]
    # One long sentence beside many short ones runs on its own...
    assert length_groups([150] + [12] * 30, call_cost=32) == [slice(0, 1), slice(1, 31)]
    # ...but a few positions of padding are not worth another call.
    assert length_groups([14, 13, 12, 12], call_cost=32) == [slice(0, 4)]
    lengths = sorted((int(n) for n in np.random.default_rng(0).integers(1, 120, 64)), reverse=True)
    groups = length_groups(lengths)
    assert [g.start for g in groups[1:]] == [g.stop for g in groups[:-1]]  # contiguous
    assert groups[0].start == 0 and groups[-1].stop == len(lengths)
    padded = sum(lengths[g.start] * (g.stop - g.start) for g in groups)
    assert padded + 32 * (len(groups) - 1) < lengths[0] * len(lengths)  # cheaper than one call


def _on_host(buffer: np.ndarray | ort.OrtValue) -> np.ndarray:
    """A cache buffer's values, wherever it lives."""
    return buffer.numpy() if isinstance(buffer, ort.OrtValue) else buffer


def test_encoding_in_length_groups_changes_no_number(engine: Engine, pairs) -> None:
    sources = [engine.tokenize(s) for s, _ in pairs[:12]]
    # One much longer than the rest, which the encoder should take in a group of its own.
    joined = [t for ids in sources[:6] for t in ids[:-1]][: engine.max_source_tokens - 1]
    sources[5] = [*joined, engine.eos_id]
    lengths = sorted((len(ids) for ids in sources), reverse=True)
    assert len(length_groups(lengths)) > 1
    batch = engine.new_batch()
    widths = [1 + i % 3 for i in range(len(sources))]  # beams: each row gets its sentence's
    for i, ids in enumerate(sources):
        batch.add(i, ids, engine.options(beam_size=widths[i]))
    batch._admit()
    cache, row = batch.cache, 0
    cross_keys, cross_values, cross_last = (
        [_on_host(b) for b in cache.cross_keys], [_on_host(b) for b in cache.cross_values],
        _on_host(cache.cross_last))
    for i, ids in enumerate(sources):
        alone_keys, alone_values, _, alone_last = engine.run_encoder(np.asarray([ids], np.int64))
        n = len(ids)
        for beam_row in range(row, row + widths[i]):
            assert cache.src_mask[beam_row].tolist() == [True] * n + [False] * (cache.src_width - n)
            for layer in range(engine.layers):
                np.testing.assert_array_equal(
                    cross_keys[layer][beam_row, :, :n], alone_keys[layer, 0]
                )
                np.testing.assert_array_equal(
                    cross_values[layer][beam_row, :, :n], alone_values[layer, 0]
                )
            np.testing.assert_array_equal(cross_last[beam_row], alone_last[0])
        row += widths[i]
    assert cache.rows == row


def test_no_repeat_ngram_size_rules_out_repeats(engine: Engine, pairs) -> None:
    sources = [s for s, _ in pairs[:40]]
    plain = engine.translate(sources)
    repeating = [i for i, t in enumerate(plain) if len(set(t.hypotheses[0].token_ids)) <
                 len(t.hypotheses[0].token_ids)]
    assert repeating  # some memorised translations repeat a token: the option must change them
    for size, beam in ((1, 1), (2, 1), (1, 3)):
        blocked = engine.translate(sources, no_repeat_ngram_size=size, beam_size=beam)
        for translation in blocked:
            ids = translation.hypotheses[0].token_ids
            ngrams = [tuple(ids[i : i + size]) for i in range(len(ids) - size + 1)]
            assert len(ngrams) == len(set(ngrams))
        if size == 1:
            assert all(blocked[i].text != plain[i].text for i in repeating)
    assert [t.text for t in engine.translate(sources, no_repeat_ngram_size=0)] == [
        t.text for t in plain
    ]
    # A bundle's recommendation applies when the caller gives none.
    engine.decoding_defaults = {"no_repeat_ngram_size": 1}
    try:
        assert [t.text for t in engine.translate(sources)] == [
            t.text for t in engine.translate(sources, no_repeat_ngram_size=1)
        ]
        assert [t.text for t in engine.translate(sources, no_repeat_ngram_size=0)] == [
            t.text for t in plain
        ]
    finally:
        engine.decoding_defaults = {}
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        engine.translate(sources[:1], no_repeat_ngram_size=-1)


def test_repeated_ngram_ends() -> None:
    assert repeated_ngram_ends([1, 2, 3, 1, 2], 3) == [3]
    assert repeated_ngram_ends([1, 2, 3, 1, 2], 2) == [3]
    assert repeated_ngram_ends([5, 5], 2) == [5]
    assert repeated_ngram_ends([1, 2], 3) == []
    assert repeated_ngram_ends([7, 8, 7], 1) == [7, 8, 7]


def test_a_hole_idles_until_a_newcomer_takes_it(engine: Engine, pairs) -> None:
    """Rows of a finished sentence stay in the batch, idle, rather than being compacted away
    (a copy of every cache) while they are under a quarter of the rows."""
    sources = sorted((s for s, _ in pairs[:20]), key=len)  # the shortest finishes first
    expected = {i: engine.translate([s])[0].text for i, s in enumerate(sources[:9])}
    batch = engine.new_batch()
    for i in range(8):
        batch.add(i, engine.tokenize(sources[i]), DecodeOptions())
    results: dict = {}
    while not results:
        results.update(batch.step())
    assert len(results) == 1 and len(batch.tokens) == 8  # one hole, kept
    for _ in range(2):  # it idles while the others decode
        results.update(batch.step())
        assert len(batch.tokens) == 8 or len(results) > 1
    batch.add(8, engine.tokenize(sources[8]), DecodeOptions())
    while len(batch):
        results.update(batch.step())
    assert {k: v.text for k, v in results.items()} == expected


def _log_probs_of(engine: Engine, key, source: str, lead: int, other: str) -> list:
    """Each step's log-probs of ``source``'s row, decoded alone (lead 0) or joining a batch
    in which ``other`` has been decoding for ``lead`` steps."""
    batch = engine.new_batch()
    if lead:
        batch.add("other", engine.tokenize(other), DecodeOptions(max_length=200))
        for _ in range(lead):
            batch.step()
    batch.add(key, engine.tokenize(source), DecodeOptions())
    seen: list = []
    run_decoder = engine.run_decoder

    def spy(session, binding):
        run_decoder(session, binding)
        row = 0
        for sentence in batch.sentences:
            if getattr(sentence, "key", None) == key:
                seen.append(batch.cache.log_probs[row].copy())
            row += sentence.width

    engine.run_decoder = spy
    try:
        while any(getattr(s, "key", None) == key for s in batch.sentences) or batch.waiting:
            batch.step()
    finally:
        engine.run_decoder = run_decoder
    return seen


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_sentence_joining_late_decodes_bit_identically(tiny_bundle: Path, variant: str,
                                                         pairs) -> None:
    """However long the batch has run when a sentence joins, its numbers are its own."""
    engine = Engine(tiny_bundle, device="cpu", threads=2, variant=variant)
    other = " ".join(s for s, _ in pairs[:6])[:300]
    source = max((s for s, _ in pairs), key=len)
    alone = _log_probs_of(engine, "s", source, 0, other)
    for lead in range(1, 10):
        joined = _log_probs_of(engine, "s", source, lead, other)
        assert len(joined) == len(alone)
        for step, (a, b) in enumerate(zip(alone, joined, strict=True)):
            assert np.array_equal(a, b), f"lead {lead}, step {step}"


def test_a_sentence_joins_a_running_batch_at_once(engine: Engine, pairs) -> None:
    """No waiting for an aligned step: with left-aligned caches (contract v3) a row's numbers
    never depend on when it joined (the test above), so it joins at the next step."""
    batch = engine.new_batch()
    batch.add("a", engine.tokenize(pairs[0][0]), DecodeOptions(max_length=50))
    for _ in range(3):
        batch.step()
    batch.add("b", engine.tokenize(pairs[1][0]), DecodeOptions())
    batch.step()
    assert not batch.waiting and [s.key for s in batch.sentences] == ["a", "b"]


def test_a_wide_source_joins_a_drained_batch_that_gave_its_memory_back(engine: Engine,
                                                                       pairs) -> None:
    """A batch whose rows all left compacts (and may shrink its buffers) when a newcomer
    arrives: the newcomer's source must still fit, however wide."""
    long_source = " ".join(s for s, _ in pairs[:4])
    ids = engine.tokenize(long_source)
    assert 32 < len(ids) <= engine.max_source_tokens
    expected = engine.translate([long_source])[0].text
    batch = engine.new_batch()
    batch.add("short", engine.tokenize(pairs[0][0]), DecodeOptions())
    while len(batch):
        batch.step()
    batch.cache.reserve(batch.cache.rows, src_width=200)  # as if a wide source had run here
    batch.add("long", ids, DecodeOptions())
    results: dict = {}
    while len(batch):
        results.update(batch.step())
    assert results["long"].text == expected


def test_a_cleared_batch_keeps_its_buffers_and_decodes_anew(engine: Engine, pairs) -> None:
    """After a step that raised, the scheduler clears the batch rather than building a new
    one: whatever its rows held, sentences added afterwards get exactly their own answer."""
    sources = [s for s, _ in pairs[:6]]
    options = DecodeOptions(beam_size=2)
    expected = [t.text for t in engine.translate(sources[3:], beam_size=2)]
    batch = engine.new_batch()
    for index in range(3):
        batch.add(index, engine.tokenize(sources[index]), options)
    batch.step()
    batch.step()  # mid-decode, as a failed step finds it
    capacity = batch.cache.capacity
    batch.clear()
    assert len(batch) == 0 and batch.num_rows == 0
    results: dict = {}
    for index in range(3, 6):
        batch.add(index, engine.tokenize(sources[index]), options)
    while len(batch):
        results.update(batch.step())
    assert [results[i].text for i in range(3, 6)] == expected
    assert batch.cache.capacity == capacity  # the same buffers


def test_banned_tokens_are_never_picked() -> None:
    sentence = Sentence.start("s", [5, 6, 2], DecodeOptions(beam_size=2), 64, banned=[3, 7])
    log_probs = np.zeros((2, 10), np.float32)
    ban_repeats(sentence, log_probs)
    assert (log_probs[:, [3, 7]] == NEG_INF).all()
    assert (np.delete(log_probs, [3, 7], axis=1) == 0).all()


def test_no_digit_is_invented_that_the_source_does_not_hold() -> None:
    """A translation may hold only the digits of its source: the shipped model wrote "twenty
    minutes" as "2 Minuten", also beside the marker of a masked item ("{0}", whose digit it may
    write). A source with "20" keeps 2 and 0; ``digits_from_source=False`` turns it off."""
    default = Path(__file__).resolve().parents[1] / "models" / "en-de"
    engine = Engine(default, device="cpu", threads=1)
    vocabulary = engine.vocabulary
    every_digit = vocabulary.digits_not_in([])  # a source with no digit: every digit piece
    digits = {vocabulary.piece(i) for i in every_digit}
    assert set("0123456789") <= digits and "<0x35>" in digits  # "5" and its byte
    # A byte above 0x7F is part of a longer character ("ò" is C3 B2), not a digit ("²").
    assert not digits & {"</s>", "<unk>", "<0x41>", "▁", "<0xB2>"}

    def written(piece: str) -> set[str]:
        return {chr(int(piece[3:5], 16))} if piece.startswith("<0x") else set(piece)

    batch = engine.new_batch()
    for key, text, options, banned in [
        ("words", "twenty minutes", DecodeOptions(), every_digit),
        ("digits", "20 minutes", DecodeOptions(),
         [i for i in every_digit if written(vocabulary.piece(i)) - {"2", "0"}]),
        ("off", "twenty minutes", DecodeOptions(digits_from_source=False), []),
    ]:
        batch.add(key, engine.tokenize(text), options)
        assert batch.waiting[-1].banned == banned, key
    assert vocabulary.target_id("0") not in vocabulary.digits_not_in(engine.tokenize("{0} at"))
    sentences = ["The train to Munich is twenty minutes late.", "I have two brothers.",
                 "My grandfather is ninety years old.", "It costs fifty euros.",
                 "The train to {0} is twenty minutes late."]  # a masked item's marker
    for translation in engine.translate(sentences, beam_size=2):
        assert not set(filter(str.isdigit, translation.text)) - {"0"}, translation.text
