"""Model resolution is offline: local dirs, the bundled model, and clear errors otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from ajet.models.resolve import ModelNotFoundError, resolve_model_path


def test_local_checkpoint_dir_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == tmp_path


def test_dir_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_hub_id_not_in_cache_gives_offline_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        resolve_model_path("some-org/some-model-that-is-not-here")


def test_nonexistent_path_names_the_bundled_alternative() -> None:
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct"):
        resolve_model_path("./no/such/dir")
