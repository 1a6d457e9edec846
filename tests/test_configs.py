"""The committed configs: each loads, and each ablation differs from the config it was measured
against (its ``base`` when it names one, else en-de-v1.toml, the default until the corpus grew)
in one thing (its source weights, its filters or its model) and its output directories, so a
result measured with it speaks about that one thing."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from training.config import load_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ABLATIONS = sorted((CONFIGS / "ablation").glob("*.toml"))


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.toml")), ids=lambda p: p.name)
def test_every_committed_config_loads(path: Path) -> None:
    config = load_config(path)
    assert config.data.sources and all(s.weight >= 0 for s in config.data.sources)


@pytest.mark.parametrize("path", ABLATIONS, ids=lambda p: p.name)
def test_an_ablation_changes_one_thing(path: Path) -> None:
    base = tomllib.loads(path.read_text(encoding="utf-8")).get("base")
    measured_against = path.parent / base if base else CONFIGS / "en-de-v1.toml"
    default, ablation = load_config(measured_against), load_config(path)
    paths = [s.path for s in ablation.data.sources]
    base_paths = [s.path for s in default.data.sources]
    assert paths[:len(base_paths)] == base_paths  # the same sources, perhaps one more
    changed = {
        "sources": paths != base_paths,
        "weights": [s.weight for s in ablation.data.sources][:len(base_paths)]
        != [s.weight for s in default.data.sources],
        "filters": ablation.data.filters != default.data.filters,
        "model": ablation.model != default.model,
        "spelled numbers": ablation.data.spell_numbers != default.data.spell_numbers,
        "swapped places": ablation.data.swap_places != default.data.swap_places,
    }
    assert sum(changed.values()) == 1, changed
    if changed["filters"] or changed["spelled numbers"] or changed["swapped places"] or \
            changed["sources"]:
        # Filters decide which pairs a fresh draw sees: the default run's dev/test must be
        # reused, or the ablation would be scored on other sentences.
        # (The base's own dev/test, or those it reuses itself.)
        assert ablation.data.heldout_from == (default.data.heldout_from or default.data.out_dir)
    if changed["model"]:
        # A model ablation trains on the default run's prepared data as it is.
        assert ablation.data == default.data
    else:
        # Its own data directory: a data ablation must never overwrite the default run's data.
        assert ablation.data.out_dir != default.data.out_dir

    def without_the_experiment(config):
        data = dataclasses.replace(config.data, sources=[], out_dir="", heldout_from="",
                                   filters=None, spell_numbers=0, swap_places=0,
                                   place_names="", swap_places_skip=[])
        return dataclasses.replace(config, data=data, model=None,
                                   train=dataclasses.replace(config.train, out_dir=""))

    # Same splits, vocabulary (so runs can share weights) and training.
    assert without_the_experiment(ablation) == without_the_experiment(default)
    assert ablation.train.out_dir != default.train.out_dir


def test_the_default_and_its_predecessor_write_to_different_places() -> None:
    new, old = load_config(CONFIGS / "en-de.toml"), load_config(CONFIGS / "en-de-v1.toml")
    for where in (lambda c: c.data.out_dir, lambda c: c.vocab.model_prefix,
                  lambda c: c.train.out_dir):
        assert where(new) != where(old)


def test_a_config_on_a_base_changes_only_what_it_states(tmp_path: Path) -> None:
    (tmp_path / "base.toml").write_text(
        '[data]\nout_dir = "runs/a"\ndev_size = 7\n[[data.sources]]\npath = "x.tsv"\n'
        '[model]\npreset = "small"\n[train]\nmax_steps = 9\n')
    (tmp_path / "gpu.toml").write_text(
        'base = "base.toml"\n[data]\nout_dir = "gpu/data"\n'
        '[model]\npreset = "base"\ndecoder_layers = 2\n')
    config = load_config(tmp_path / "gpu.toml", ["train.max_steps=3"])
    assert (config.data.out_dir, config.data.dev_size) == ("gpu/data", 7)
    assert [s.path for s in config.data.sources] == ["x.tsv"]
    assert (config.model.d_model, config.model.decoder_layers) == (512, 2)
    assert config.train.max_steps == 3
    (tmp_path / "base.toml").write_text('base = "gpu.toml"\n')
    with pytest.raises(ValueError, match="config base loop"):
        load_config(tmp_path / "gpu.toml")
