"""Campaign settings: TOML, flags over file over stored, one-line errors naming the key."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.config.errors import UserError
from harness.config.files import load_toml
from harness.config.settings import KEYS, TRAINING_KEYS, CampaignSettings, build
from harness.config.training import TrainSettings
from harness.config.values import FLOAT_RANGES


def test_defaults_are_what_a_user_would_pick() -> None:
    config = CampaignSettings()
    assert (config.backend, config.model, config.group_size, config.candidates) == (
        "auto",
        "smollm2",
        4,
        3,
    )
    assert config.islands == 4 and config.strategy == "evolve"
    # Iterations in flight and the context length come from the backend and the model.
    assert (config.concurrency, config.context_tokens, config.max_failures) == (0, 0, 10)
    # `vpo config show` prints them with the rest.
    shown = config.to_toml()
    for line in ('backend = "auto"', "concurrency = 0", "context_tokens = 0", "retries = 4",
                 "max_failures = 10", "draft_chars = 4000", "feedback_chars = 2000"):  # fmt: skip
        assert line in shown.splitlines()


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
        ({"backend": "tgi"}, "'backend' must be auto or transformers or vllm or openai"),
        ({"concurrency": -1}, "'concurrency' must be a whole number from 0 to 1024"),
        ({"context_tokens": 500}, "'context_tokens' must be more than max_tokens \\(768\\)"),
        ({"max_failures": 0}, "'max_failures' must be a whole number >= 1"),
        ({"retries": 101}, "'retries' must be a whole number from 0 to 100"),
        ({"draft_chars": 10}, "'draft_chars' must be a whole number >= 200"),
        ({"backend": "openai"}, "'base_url' must be the endpoint URL"),
        ({"candidates": 20}, "'candidates' must be a whole number from 1 to 8"),
        ({"top_k": -1}, "'top_k' must be a whole number >= 0 \\(0: off\\)"),
        ({"top_k": 2.5}, "'top_k' must be a whole number, got 2.5"),
        ({"top_k": "forty"}, "'top_k' must be a whole number, got 'forty'"),
        ({"colour": "blue"}, "unknown key 'colour'"),
        ({"temprature": 0.5}, "did you mean 'temperature'"),
        # A prompt shows at most 4 drafts: a larger number would be stored and never shown.
        ({"drafts": 6}, "'drafts' must be a whole number from 0 to 4"),
        # One rollout per prompt has nothing to be compared with: every advantage is 0.
        ({"group_size": 1, "train_every": 2}, "'group_size' must be at least 2 when training"),
    ],
)
def test_bad_values_name_the_key(layer: dict, words: str) -> None:
    with pytest.raises(UserError, match=words) as info:
        build(layer)
    assert "\n" not in str(info.value)


def test_a_file_with_top_k_loads_and_round_trips(tmp_path: Path) -> None:
    """top_k in [sampling] (0, the default, is off): the campaign samples with it, a step's
    log-probs are cut as the sampler's were, and `vpo config show` writes it back."""
    from harness.evolution.generation import loop_settings

    class Server:  # what `loop_settings` asks of a generator
        backend, model, in_process = "openai", "m", False

        def context_tokens(self) -> None:
            return None

    assert CampaignSettings().top_k == 0 and CampaignSettings().sampling().top_k == 0
    file = tmp_path / "campaign.toml"
    file.write_text("[sampling]\ntop_k = 40\ntop_p = 1.0\n")
    config = build(load_toml(file))
    assert (config.top_k, config.top_p) == (40, 1.0)
    assert (config.sampling().top_k, config.sampling().top_p) == (40, 1.0)
    assert loop_settings(config, Server()).sampling.top_k == 40
    assert "top_k = 40" in config.to_toml().splitlines()
    shown = tmp_path / "shown.toml"
    shown.write_text(config.to_toml())
    assert build(load_toml(shown)) == config
    assert build(config.to_dict()) == config  # as a campaign stores it
    assert build({"top_k": 0}).top_k == 0


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


@pytest.mark.parametrize(
    "text,words",
    [
        ("[model]\ntemperature = 1.0\n", "'temperature' belongs in [sampling], not in [model]"),
        ("[sampling]\nseed = 1\n", "'seed' belongs at the top of the file, not in [sampling]"),
        ("[sampilng]\ntemperature = 1\n", "unknown section [sampilng] in"),
        ("[sampilng]\ntemperature = 1\n", "; did you mean [sampling]?"),
        ("[colours]\nred = 1\n", "(known: [model], [generation], [sampling], "),
        ("[sampling]\ntemprature = 1\n", "'temprature' in [sampling] of"),
        ("[model]\ntemprature = 1.0\n", "did you mean 'temperature' in [sampling]?"),
        ("itrations = 3\n", "did you mean 'iterations' at the top of the file?"),
        ("[sampling.extra]\ntemperature = 1.0\n", "unknown key 'extra' in [sampling]"),
    ],
)
def test_toml_keys_and_sections_must_be_known_and_in_place(
    tmp_path: Path, text: str, words: str
) -> None:
    """A key in the wrong section, or a misspelt one, would otherwise change nothing quietly."""
    file = tmp_path / "campaign.toml"
    file.write_text(text)
    with pytest.raises(UserError) as info:
        load_toml(file)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_every_setting_has_one_section_or_the_top(tmp_path: Path) -> None:
    from harness.config.files import SECTIONS

    top = {"problem", "name", "seed", "iterations", "token_budget", "strategy"}
    in_sections = [key for keys in SECTIONS.values() for key in keys]
    assert sorted([*top, *in_sections]) == sorted(KEYS)
    # The layout docs/campaigns.md shows loads as it is.
    docs = (Path(__file__).parents[1] / "docs" / "campaigns.md").read_text()
    file = tmp_path / "campaign.toml"
    file.write_text(docs.split("```toml\n", 1)[1].split("```", 1)[0])
    assert build(load_toml(file)) == CampaignSettings(iterations=50)


FLOAT_SETTINGS = sorted(name for name, f in KEYS.items() if f.type == "float")


def test_every_float_setting_has_a_range() -> None:
    assert FLOAT_SETTINGS == sorted(FLOAT_RANGES)


@pytest.mark.parametrize("key", FLOAT_SETTINGS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e300, -1.0])
def test_float_settings_must_be_finite_and_in_range(key: str, value: float) -> None:
    """From a layer (file, flags, stored) and built directly alike, one line naming the key."""
    record = TrainSettings if key in TRAINING_KEYS else CampaignSettings
    for attempt in (lambda: build({key: value}), lambda: record(**{key: value})):
        with pytest.raises(UserError, match=f"config key '{key}' must be .*, got") as info:
            attempt()
        assert "\n" not in str(info.value)


def test_toml_inf_and_nan_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "campaign.toml"
    for value in ("inf", "+inf", "nan", "-nan"):
        file.write_text(f"[evaluation]\ntime_limit = {value}\n")
        with pytest.raises(UserError, match="'time_limit' must be a number of seconds from 0"):
            build(load_toml(file))
    file.write_text("[evaluation]\ntime_limit = 86400\n[training]\nkl_beta = 0\n")
    assert build(load_toml(file)).time_limit == 86400.0


def test_every_setting_with_help_is_a_flag_unset_unless_given() -> None:
    """The flags of `vpo run`, `vpo worker` and `vpo config show` are made from the fields:
    each is None unless given, so only the flags typed override the file and the database."""
    from harness.cli.parser import build_parser

    settings = [name for name, f in KEYS.items() if "help" in f.metadata]
    assert {"iterations", "group_size", "learning_rate", "lora", "policy_dir"} <= set(settings)
    for command in (["run"], ["worker"], ["config", "show"]):
        args = build_parser().parse_args(command)
        assert all(getattr(args, name) is None for name in settings)
    given = ["-G", "2", "-m", "1", "--lr", "1e-4", "--lora", "--policy-dir", "p", "--seed", "7"]
    args = build_parser().parse_args(["run", *given])
    assert (args.group_size, args.candidates, args.learning_rate, args.lora) == (2, 1, 1e-4, True)
    assert (args.policy_dir, args.seed) == ("p", 7)
    assert build({k: getattr(args, k) for k in settings}).training.learning_rate == 1e-4


def test_training_is_one_table_held_whole_and_old_flat_settings_read_the_same(
    tmp_path: Path,
) -> None:
    """A campaign holds its TrainSettings whole; it stores them as a table, a campaign stored
    before that (training keys among the rest) reads the same, and `vpo config show` prints a
    file that loads back as the config it shows."""
    flat = {"problem": "x", "train_every": 2, "learning_rate": 1e-4, "lora": True, "seed": 3}
    config = build(flat)
    assert config.training == TrainSettings(train_every=2, learning_rate=1e-4, lora=True)
    stored = config.to_dict()
    assert stored["training"]["learning_rate"] == 1e-4 and "learning_rate" not in stored
    assert build(stored) == config == build(config.flat())
    assert "training" not in config.flat() and config.flat()["lora"] is True
    assert build(stored, {"kl_beta": 0.0}).training.kl_beta == 0  # a later layer overrides
    file = tmp_path / "shown.toml"
    file.write_text(config.to_toml())
    assert build(load_toml(file)) == config
    # The sampling a step needs comes from the campaign's own settings, not a copy.
    sampling = config.sampling()
    assert (sampling.model, sampling.seed, sampling.temperature) == ("smollm2", 3, 0.8)
    for bad, words in (
        ({"training": 3}, "'training' in the settings must be a table"),
        ({"training": {"lern_rate": 1}}, "unknown training key 'lern_rate'"),
    ):
        with pytest.raises(UserError, match=words) as info:
            build(bad, where="the settings")
        assert "\n" not in str(info.value)


def test_vpo_train_takes_every_shared_training_setting_as_the_campaign_flag() -> None:
    """`vpo train`'s training flags are the campaign's (names, types), less the loop's own;
    a bad value is named by its flag."""
    from harness.cli.flags import SETTING_FLAGS, TRAIN_FLAGS
    from harness.cli.parser import build_parser
    from harness.cli.train import _training

    assert {"reward_reference", "slot_cost", "micro_batch", "shared_prompt"} <= set(TRAIN_FLAGS)
    assert not {"sample_after_step", "policy_dir", "keep_versions"} & set(TRAIN_FLAGS)
    args = build_parser().parse_args(
        ["train", "--micro-batch", "2", "--no-shared-prompt", "--slot-cost", "0.1"]
    )
    trained = _training(args, TrainSettings())
    assert (trained.micro_batch, trained.shared_prompt, trained.slot_cost) == (2, False, 0.1)
    args = build_parser().parse_args(["train", "--reward-reference", "front"])
    with pytest.raises(UserError, match="^--reward-reference must be none, parent"):
        _training(args, TrainSettings())
    assert set(TRAIN_FLAGS) <= set(SETTING_FLAGS)


def test_a_reward_rule_is_one_entry_its_checks_help_and_docs_follow() -> None:
    """REWARD_CHOICES is the one table of the reward rules with named choices: every choice is
    named in its setting's help and in docs/training.md, the default is one of them, and a
    value outside them is refused in one line by the settings and by `vpo train`'s flag."""
    from harness.cli.parser import build_parser
    from harness.cli.train import _checked_out
    from harness.config.training import REWARD_CHOICES, REWARD_RULES, TrainSettings

    docs = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    fields = TrainSettings.__dataclass_fields__
    assert set(REWARD_RULES) <= set(fields)
    for rule, choices in REWARD_CHOICES.items():
        help_text = fields[rule].metadata["help"]
        assert fields[rule].default in choices
        for choice in choices:
            assert choice in help_text, (rule, choice)
            assert f"`{choice}`" in docs or f'"{choice}"' in docs, (rule, choice)
        listed = ", ".join(choices)
        listed = listed[::-1].replace(" ,", " ro ", 1)[::-1]  # "a, b or c"
        with pytest.raises(UserError, match=f"^config key '{rule}' must be {listed}$"):
            TrainSettings(**{rule: "nothing"})
        flag = "--" + rule.replace("_", "-")
        args = build_parser().parse_args(["train", "--db", "x.db", flag, "nothing"])
        with pytest.raises(UserError, match=f"^{flag} must be {listed}, not 'nothing'$"):
            _checked_out(args)
