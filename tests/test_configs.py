"""The committed configs: each loads, and each data-mix ablation differs from the default
config in its source weights and output directories only, so a result measured with it speaks
about the mix and nothing else."""

from __future__ import annotations

import dataclasses
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
def test_a_mix_ablation_changes_only_the_weights(path: Path) -> None:
    default, ablation = load_config(CONFIGS / "en-de.toml"), load_config(path)
    assert [s.path for s in ablation.data.sources] == [s.path for s in default.data.sources]
    assert [s.weight for s in ablation.data.sources] != [s.weight for s in default.data.sources]

    def without_mix(config):
        data = dataclasses.replace(config.data, sources=[], out_dir="")
        return dataclasses.replace(config, data=data,
                                   train=dataclasses.replace(config.train, out_dir=""))

    # Same filters, splits, vocabulary (so runs can share weights), model and training.
    assert without_mix(ablation) == without_mix(default)
    # Its own run directories: an ablation must never overwrite the default run's data.
    assert ablation.data.out_dir != default.data.out_dir
    assert ablation.train.out_dir != default.train.out_dir
