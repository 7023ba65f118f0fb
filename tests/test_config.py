"""Campaign settings: TOML, flags over file over stored, one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import CampaignConfig, build, load_toml
from harness.errors import UserError


def test_defaults_are_what_a_user_would_pick() -> None:
    config = CampaignConfig()
    assert (config.backend, config.model, config.group_size, config.candidates) == (
        "transformers",
        "smollm2",
        4,
        3,
    )
    assert config.islands == 4 and config.strategy == "evolve"


def test_layers_apply_in_order_and_none_means_unset(tmp_path: Path) -> None:
    file = tmp_path / "campaign.toml"
    file.write_text(
        'problem = "circle_packing"\niterations = 7\n\n[sampling]\ngroup_size = 2\n'
        "temperature = 0.5\n"
    )
    stored = {"iterations": 3, "group_size": 8, "seed": 5}
    config = build(stored, load_toml(file), {"iterations": 9, "seed": None})
    assert (config.iterations, config.group_size, config.seed, config.temperature) == (
        9,
        2,
        5,
        0.5,
    )


def test_toml_round_trip(tmp_path: Path) -> None:
    config = build({"model": 'a "quoted" name', "base_url": None, "time_limit": 2.5})
    file = tmp_path / "shown.toml"
    file.write_text(config.to_toml())
    assert build(load_toml(file)) == config


@pytest.mark.parametrize(
    "layer,words",
    [
        ({"group_size": 0}, "'group_size' must be a whole number >= 1"),
        ({"group_size": "four"}, "'group_size' must be a whole number, got 'four'"),
        ({"temperature": True}, "'temperature' must be a number"),
        ({"strategy": "random"}, "'strategy' must be evolve or best-of-n"),
        ({"backend": "tgi"}, "'backend' must be transformers or vllm or openai"),
        ({"backend": "openai"}, "'base_url' must be the endpoint URL"),
        ({"candidates": 20}, "'candidates' must be a whole number from 1 to 8"),
        ({"colour": "blue"}, "unknown key 'colour'"),
    ],
)
def test_bad_values_name_the_key(layer: dict, words: str) -> None:
    with pytest.raises(UserError, match=words) as info:
        build(layer)
    assert "\n" not in str(info.value)


def test_bad_toml_is_one_line(tmp_path: Path) -> None:
    file = tmp_path / "broken.toml"
    file.write_text("iterations = = 3\n")
    with pytest.raises(UserError, match="not valid TOML"):
        load_toml(file)
    with pytest.raises(UserError, match="no such file"):
        load_toml(tmp_path / "missing.toml")
    file.write_text("[model]\nflavour = 1\n")
    with pytest.raises(UserError, match="unknown key 'flavour'"):
        load_toml(file)
