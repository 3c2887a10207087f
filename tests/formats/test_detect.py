"""Model-family detection: config.json decides, the served name is only a fallback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deepseek_frontend.formats import default_effort_profile, detect_family


def _checkpoint(tmp_path: Path, config: Any, encoder: str | None = None) -> Path:
    (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if encoder is not None:
        (tmp_path / "encoding").mkdir()
        (tmp_path / "encoding" / "encoding_dsv4.py").write_text(encoder)
    return tmp_path


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("deepseek-v4-flash", "deepseek_v4"),
        ("DeepSeek_V4", "deepseek_v4"),
        ("deepseekv4", "deepseek_v4"),
        ("DeepSeek-V4-Pro", "deepseek_v4"),
        ("deepseek.v4", "deepseek_v4"),
        ("deepseek-v4.1-flash", "deepseek_v41"),
        ("DeepSeek-V4.1", "deepseek_v41"),
        ("deepseek_v41", "deepseek_v41"),
        ("deepseek-v4-1-flash", "deepseek_v41"),
        ("deepseek-v3.2", "deepseek_v32"),
        ("DeepSeek-V3.2-Exp", "deepseek_v32"),
        ("deepseek_v3_2", "deepseek_v32"),
        ("deepseekv32", "deepseek_v32"),
        ("deepseek-v3.2-v4-foo", "deepseek_v32"),
        # Hugging Face repo ids: the anchored rule applies to the last path component.
        ("deepseek-ai/DeepSeek-V4-Flash", "deepseek_v4"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek_v32"),
        ("/models/deepseek-ai/DeepSeek-V4.1-Flash", "deepseek_v41"),
    ],
)
def test_served_names_are_accepted_when_there_is_no_config(name: str, family: str) -> None:
    assert detect_family(served_model_name=name) == family


@pytest.mark.parametrize(
    "name",
    [
        "my-deepseek-v4",
        "deepseek-v40",
        "deepseek-v4pro",
        "deepseek-v3",
        "deepseek-v32b",
        "llama-3",
        "",
        "v4",
        "foo/my-deepseek-v4",
        "deepseek-v4/llama-3",
        "deepseek-ai/",
    ],
)
def test_served_names_that_only_resemble_deepseek_are_rejected(name: str) -> None:
    assert detect_family(served_model_name=name) is None


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"model_type": "deepseek_v4"}, "deepseek_v4"),
        ({"model_type": "deepseek_v41"}, "deepseek_v41"),
        ({"model_type": "deepseek_v4", "architectures": ["DeepseekV41ForCausalLM"]}, "deepseek_v41"),
        ({"model_type": "deepseek_v32"}, "deepseek_v32"),
        ({"model_type": "deepseek_v3_2"}, "deepseek_v32"),
    ],
)
def test_config_model_type_decides_the_family(tmp_path: Path, config: dict[str, Any], family: str) -> None:
    assert detect_family(_checkpoint(tmp_path, config), served_model_name="llama") == family


def test_a_concrete_other_model_type_wins_over_a_deepseek_served_name(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, {"model_type": "llama"})
    assert detect_family(path, served_model_name="deepseek-v4-flash") is None


@pytest.mark.parametrize("config", [{"model_type": ""}, {}, "not json {", ["a list"]])
def test_a_config_without_a_usable_model_type_falls_back_to_the_name(tmp_path: Path, config: Any) -> None:
    path = _checkpoint(tmp_path, config)
    assert detect_family(path, served_model_name="deepseek-v4-flash") == "deepseek_v4"
    assert detect_family(path) is None


def test_a_missing_model_directory_falls_back_to_the_name(tmp_path: Path) -> None:
    assert detect_family(tmp_path / "absent", "DeepSeek-V3.2") == "deepseek_v32"
    assert detect_family("", "") is None
    assert detect_family() is None


def test_effort_profile_comes_from_an_explicit_config_key_first(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, {"model_type": "deepseek_v4", "dsv4_reasoning_effort_profile": "official"})
    assert default_effort_profile(path) == "official"


def test_effort_profile_is_read_from_the_bundled_reference_encoder(tmp_path: Path) -> None:
    official = _checkpoint(tmp_path / "a", {"model_type": "deepseek_v4"}, "REASONING_EFFORT_PROMPTS = {}")
    preview = _checkpoint(tmp_path / "b", {"model_type": "deepseek_v4"}, "REASONING_EFFORT_MAX = ''")
    assert default_effort_profile(official, served_model_name="DeepSeek-V4-Flash") == "official"
    assert default_effort_profile(preview, served_model_name="DeepSeek-V4-Flash-0731") == "preview"


def test_effort_profile_falls_back_to_the_0731_name_tag_then_preview(tmp_path: Path) -> None:
    assert default_effort_profile(served_model_name="DeepSeek-V4-Flash-0731") == "official"
    assert default_effort_profile(tmp_path / "DeepSeek-V4-Flash-0731") == "official"
    assert default_effort_profile(served_model_name="DeepSeek-V4-Flash") == "preview"
    assert default_effort_profile(served_model_name="deepseek-v4-flash-07310") == "preview"
    assert default_effort_profile() == "preview"


# Make the tmp sub-directories used above.
@pytest.fixture(autouse=True)
def _subdirs(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
