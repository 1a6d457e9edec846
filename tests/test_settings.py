"""The settings tables of docs/configuration.md and README.md are generated from
``service/settings.py``, the one place each setting's name, default and meaning are written."""

from __future__ import annotations

import shutil
from pathlib import Path

from service.settings import (
    README_SETTINGS,
    REGENERATE,
    ROOT,
    Settings,
    documented,
    write_tables,
)


def test_the_committed_settings_tables_are_those_settings_py_generates() -> None:
    for path, wanted in documented().items():
        assert path.read_text(encoding="utf-8") == wanted, (
            f"the settings table of {path.relative_to(ROOT)} differs from service/settings.py: "
            f"run `{REGENERATE}` and commit the result")


def test_every_setting_is_described_and_the_readme_shows_a_dozen() -> None:
    undescribed = [name for name, field in Settings.model_fields.items() if not field.description]
    assert not undescribed
    assert set(README_SETTINGS) <= set(Settings.model_fields) and len(README_SETTINGS) == 12


def test_regenerating_rewrites_a_stale_table_and_keeps_the_rest(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for name in ("README.md", "docs/configuration.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    stale = tmp_path / "docs" / "configuration.md"
    committed = stale.read_text(encoding="utf-8")
    assert "| `MAX_QUEUE` | `2048` |" in committed
    stale.write_text(committed.replace("| `MAX_QUEUE` | `2048` |", "| `MAX_QUEUE` | `99` |")
                     + "A line after the table.\n", encoding="utf-8")
    assert write_tables(tmp_path) == [stale]
    assert stale.read_text(encoding="utf-8") == committed + "A line after the table.\n"
    assert write_tables(tmp_path) == []  # nothing left to rewrite
