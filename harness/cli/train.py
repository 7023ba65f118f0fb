"""`vpo train`: fine-tune a model on a campaign's groups (--db), beside its workers
(--db --follow), or by RL on an answer problem (--problem maze).

`python -m harness.cli.train ARGS` is `vpo train ARGS`: the module `accelerate launch` and
`torchrun` start on every device (`accelerate launch --multi_gpu -m harness.cli.train --db ...`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.cli.campaigns import find_campaign
from harness.cli.flags import (
    TRAIN_FLAGS,
    add_setting,
    given_settings,
    positive_float,
    positive_int,
    setting_flag,
)
from harness.config import logs
from harness.config.errors import UserError
from harness.config.settings import CAMPAIGN_KEYS, TRAINING_KEYS, build
from harness.config.training import (
    ANSWER_TRAINING,
    DEFAULT_MODEL,
    FOLLOW_EVERY,
    GRADIENT_CHECKPOINTING,
    LORA_LEARNING_RATE,
    OLD_LOGPROBS,
    REWARD_CHOICES,
    REWARD_RULES,
    AnswerSettings,
    OfflineSettings,
    Sampling,
    TrainSettings,
    trained_temperature,
    unknown_choice,
)
from trainer.estimators import unknown

SHARDINGS = ("auto", "fsdp", "ddp", "none")  # trainer.distributed's, without importing torch


def add_commands(commands: Any) -> None:
    p = commands.add_parser(
        "train",
        help="fine-tune a model on a database's groups (--db), "
        "or by RL on an answer problem (--problem maze)",
    )
    p.add_argument("--db", default=None, help="database file or URL of the campaign to learn from")
    p.add_argument(
        "--problem",
        default=None,
        help="an answer problem (maze): VPO reinforcement learning on generated instances, "
        "evaluated by best@k and pass@k on held-out ones",
    )
    p.add_argument(
        "--out",
        default=None,
        help="folder for the trained model (with --follow: for the policy versions; default "
        "the campaign's policy folder)",
    )
    p.add_argument("--name", default=None, help="campaign name (default: the only one)")
    add_setting(
        p, CAMPAIGN_KEYS["model"], help=f"base model (default: the campaign's, or {DEFAULT_MODEL})"
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help=f"steps (default: one pass over the groups; {AnswerSettings.steps} with --problem)",
    )
    p.add_argument("--groups-per-step", dest="groups_per_step", type=positive_int, default=None)
    p.add_argument(
        "--sharding",
        default="auto",
        help="on several processes (torchrun, accelerate launch): fsdp (each process holds a "
        "shard of the weights and optimiser), ddp (whole copies) or auto (fsdp when there are "
        "several processes or accelerate's config asks for FSDP; none on one)",
    )
    add_setting(p, CAMPAIGN_KEYS["seed"])
    # The campaign's own training flags, from the same settings (names, help, types).
    settings = p.add_argument_group(
        "training settings (default: the campaign's with --follow; otherwise as shown, but "
        f"--old-logprobs recompute, --lr {LORA_LEARNING_RATE:g} with --lora, with --db the "
        f"campaign's reward rules, and --micro-batch {ANSWER_TRAINING.micro_batch} with "
        "--problem, whose prompts are long)"
    )
    for name, field in TRAIN_FLAGS.items():
        if name != "train_every":  # a flag of --follow's, below
            add_setting(settings, field)
    _add_follow_flags(p.add_argument_group("with --db --follow (beside `vpo worker` processes)"))
    _add_answer_flags(p.add_argument_group("with --problem (answer problems)"))
    p.set_defaults(handler=cmd_train)


def _add_follow_flags(follow: Any) -> None:
    follow.add_argument(
        "--follow",
        action="store_true",
        help="keep training on new groups as workers record them, publishing policy versions, "
        "until the campaign's budget is recorded and used",
    )
    add_setting(
        follow,
        TRAINING_KEYS["train_every"],
        help=f"groups per step with --follow (default: the campaign's train_every, else "
        f"{FOLLOW_EVERY})",
    )
    follow.add_argument(
        "--poll", type=positive_float, default=2.0, help="seconds between looks (default 2)"
    )


def _add_answer_flags(rl: Any) -> None:
    rl.add_argument(
        "--group-size",
        dest="group_size",
        type=positive_int,
        default=AnswerSettings.group_size,
        help=f"completions per prompt (default {AnswerSettings.group_size})",
    )
    rl.add_argument(
        "--candidates",
        type=positive_int,
        default=AnswerSettings.candidates,
        help=f"answers per completion, m (default {AnswerSettings.candidates})",
    )
    rl.add_argument(
        "--max-tokens", dest="max_tokens", type=positive_int, default=AnswerSettings.max_tokens
    )
    rl.add_argument(
        "--temperature",
        type=positive_float,
        default=Sampling.temperature,
        help=f"sampling temperature while training (default {Sampling.temperature})",
    )
    rl.add_argument(
        "--eval-prompts",
        dest="eval_prompts",
        type=positive_int,
        default=AnswerSettings.eval_prompts,
        help=f"held-out instances evaluated (default {AnswerSettings.eval_prompts}; "
        "the paper used 100)",
    )
    rl.add_argument(
        "--eval-generations",
        dest="eval_generations",
        type=positive_int,
        default=AnswerSettings.eval_generations,
        help=f"completions per held-out prompt (default {AnswerSettings.eval_generations})",
    )
    rl.add_argument(
        "--eval-every",
        dest="eval_every",
        type=positive_int,
        default=None,
        help="also evaluate every N steps (default: before and after only)",
    )
    rl.add_argument(
        "--train-size",
        dest="train_size",
        type=positive_int,
        default=AnswerSettings.train_size,
        help=f"training instances cycled through (default {AnswerSettings.train_size})",
    )


def cmd_train(args: argparse.Namespace) -> int:
    from harness.store import Store

    out = _checked_out(args)
    if args.problem is not None:
        if args.follow:
            raise UserError(
                "--follow trains beside workers on a campaign: give --db, not --problem"
            )
        return _train_answers(args, out)
    store = Store.open(args.db, create=False)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one process writes the log
        logs.attach_file(store.where, args.log_dir)
    campaign = find_campaign(store, args.name, required=True)
    if args.follow:
        return _train_follow(args, store, campaign)
    return _train_offline(args, store, campaign, out)


def _checked_out(args: argparse.Namespace) -> Path:
    """The folder the model goes to, once the flags are known to make sense together."""
    for rule in REWARD_CHOICES:
        value = getattr(args, rule, None)
        if value is not None and (why := unknown_choice(rule, value)):
            raise UserError(f"--{rule.replace('_', '-')}{why[len(rule) :]}")
    if args.overlong_buffer is not None and args.overlong_buffer < 0:
        raise UserError(
            f"--overlong-buffer must be a whole number >= 0, not {args.overlong_buffer}"
        )
    if args.overlong_buffer is not None and args.problem is not None:
        raise UserError("--overlong-buffer scores a campaign's groups: give --db, not --problem")
    if args.old_logprobs not in (None, *OLD_LOGPROBS):
        raise UserError(
            f"--old-logprobs must be {', '.join(OLD_LOGPROBS)}, not {args.old_logprobs!r}"
        )
    if args.gradient_checkpointing not in (None, *GRADIENT_CHECKPOINTING):
        raise UserError(
            f"--gradient-checkpointing must be {', '.join(GRADIENT_CHECKPOINTING)}, "
            f"not {args.gradient_checkpointing!r}"
        )
    if args.sharding not in SHARDINGS:
        raise UserError(f"--sharding must be {', '.join(SHARDINGS)}, not {args.sharding!r}")
    if args.sharding != "auto" and args.problem is not None:
        raise UserError("--sharding goes with --db; answer-problem training runs on one process")
    if args.advantage is not None and (why := unknown(args.advantage)):
        raise UserError(f"--{why}")
    if args.train_every is not None and args.train_every < 1:
        raise UserError(f"--train-every must be a whole number >= 1, not {args.train_every}")
    # The rest as the settings check them (ranges: no NaN or infinity), named by their flags.
    _training(args, TrainSettings())
    if (args.db is None) == (args.problem is None):
        raise UserError(
            "give either --db (learn from a campaign's groups) or --problem (RL on an answer "
            "problem such as maze)"
        )
    if args.out is None and not args.follow:
        raise UserError("--out is required: the folder the trained model is written to")
    out = Path(args.out or ".")
    if (
        args.out is not None
        and not args.follow
        and out.exists()
        and (not out.is_dir() or any(out.iterdir()))
    ):
        raise UserError(f"--out {out} exists and is not an empty folder")
    return out


def _training(args: argparse.Namespace, base: TrainSettings) -> TrainSettings:
    """`base` under the training flags given (a bad value named by its flag); a LoRA adapter
    starts from its own learning rate."""
    given = given_settings(args, TRAIN_FLAGS)
    given.pop("train_every", None)  # --follow's groups per step
    try:
        settings = replace(base, **given)
    except UserError as error:  # "config key 'kl_beta' must be ...": say the flag
        for name in TRAIN_FLAGS:
            error = UserError(str(error).replace(f"config key {name!r}", setting_flag(name)))
        raise error from None
    if args.learning_rate is None and settings.lora:
        settings = replace(settings, learning_rate=LORA_LEARNING_RATE)
    return settings


def _sampling(args: argparse.Namespace, base: Sampling) -> Sampling:
    """`base` under --model and --seed."""
    return replace(base, **_given(model=args.model or None, seed=args.seed))


def _given(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _train_offline(args: argparse.Namespace, store: Any, campaign: Any, out: Path) -> int:
    from harness.learning.offline import train_offline

    stored = build(campaign.config, where="the campaign's settings")
    # An offline pass trains a model of its own: the campaign's rollouts were sampled by other
    # weights, so its ratio starts at 1 unless --old-logprobs says otherwise. The campaign's
    # reward rules: the groups score as they did when it trained on them.
    rules = {name: getattr(stored.training, name) for name in REWARD_RULES}
    training = _training(args, TrainSettings(old_logprobs="recompute", **rules))
    sampled = Sampling(
        model=stored.model,
        temperature=trained_temperature(stored.temperature),
        top_p=stored.top_p,
        top_k=stored.top_k,
    )
    if training.overlong_buffer >= stored.max_tokens:
        raise UserError(
            f"--overlong-buffer must be below the campaign's max_tokens ({stored.max_tokens}), "
            f"not {training.overlong_buffer}"
        )
    settings = OfflineSettings(
        out=out,
        training=training,
        sampling=_sampling(args, sampled),
        **_given(steps=args.steps, groups_per_step=args.groups_per_step),
    )
    # Under torchrun or `accelerate launch` every process runs this; one of them speaks.
    speaks = os.environ.get("RANK", "0") == "0"
    if speaks:
        model = settings.sampling.model
        logs.say(f"training {model} on campaign {campaign.name!r} of {store.where}")
    parallel = _joined(args)
    try:
        history = train_offline(
            store,
            campaign.id,
            stored.candidates,
            settings,
            on_step=lambda metrics: logs.say(metrics.line()),
            parallel=parallel,
            max_tokens=stored.max_tokens,
        )
    finally:
        parallel.close()
    if speaks:
        logs.say(f"{len(history)} steps; model written to {out} (vpo run --model {out})")
    return 0


def _train_follow(args: argparse.Namespace, store: Any, campaign: Any) -> int:
    from harness.learning.offline import follow

    overrides: dict[str, Any] = {
        **given_settings(args, TRAIN_FLAGS),
        "model": args.model or None,
        "policy_dir": None if args.out is None else str(Path(args.out).resolve()),
    }
    parallel = _joined(args)
    try:
        follow(
            store,
            campaign,
            overrides,
            steps=args.steps,
            poll=args.poll,
            say=logs.say,
            parallel=parallel,
        )
    finally:
        parallel.close()
    return 0


def _joined(args: argparse.Namespace) -> Any:
    """This process among torchrun's or accelerate's (trainer/distributed.py)."""
    from trainer.distributed import Parallel, ParallelError

    try:
        return Parallel.join(args.sharding)
    except ParallelError as error:
        raise UserError(str(error)) from None


def _train_answers(args: argparse.Namespace, out: Path) -> int:
    from harness.learning.answers import train_answers
    from problems.api import AnswerProblem
    from problems.registry import load as load_problem

    problem = load_problem(args.problem)
    if not isinstance(problem, AnswerProblem):
        raise UserError(
            f"{problem.name} is a program problem: run a campaign on it (vpo run {args.problem}) "
            "and train on its database (vpo train --db ...)"
        )
    if args.name is not None:
        raise UserError("--name picks a campaign of --db; it does not go with --problem")
    settings = AnswerSettings(
        out=out,
        training=_training(args, ANSWER_TRAINING),
        sampling=_sampling(args, Sampling(temperature=args.temperature)),
        **_given(
            steps=args.steps,
            prompts_per_step=args.groups_per_step,
            group_size=args.group_size,
            candidates=args.candidates,
            max_tokens=args.max_tokens,
            eval_prompts=args.eval_prompts,
            eval_generations=args.eval_generations,
            eval_every=args.eval_every,
            train_size=args.train_size,
        ),
    )
    print(
        f"training {settings.sampling.model} on {problem.name} by RL: {settings.steps} steps "
        f"of {settings.prompts_per_step} prompts x {settings.group_size} completions, "
        f"m = {settings.candidates}"
    )
    train_answers(problem, settings, say=logs.say)
    print(f"model and report (vpo-train.json) written to {out}")
    return 0


if __name__ == "__main__":
    from harness.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
