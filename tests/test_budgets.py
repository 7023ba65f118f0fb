"""Token and cost budgets: a tiny real campaign stops once its stored tokens (or their cost)
reach the budget, says why, and goes on when resumed with a larger one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from chat_server import chat_server
from test_campaign import fast_settings

from harness.cli import main
from harness.config.errors import UserError
from harness.config.settings import build
from harness.evolution.budgets import stored_spend
from harness.evolution.loop import run_campaign
from harness.observation import status
from harness.store import Store
from problems.circle_packing import CirclePacking


def settings(model: str, **extra: object) -> dict[str, object]:
    return fast_settings(model, backend="transformers", iterations=4, concurrency=1, **extra)


def test_a_token_budget_stops_the_campaign_and_a_larger_one_resumes_it(
    tmp_path: Path, tiny_model: str
) -> None:
    store = Store.open(tmp_path / "run.db")
    said: list[str] = []
    # The first iteration's prompt alone is past 100 tokens: it is the only batch.
    config = build(settings(tiny_model, max_total_tokens=100))
    campaign_id = run_campaign(config, store, CirclePacking(), say=said.append)
    assert store.iterations_done(campaign_id) == 1
    spend = stored_spend(store, campaign_id)
    assert spend.prompt_tokens > 100 and spend.completion_tokens > 0
    assert store.summary(campaign_id).tokens == spend.completion_tokens
    assert (
        f"token budget reached: {spend.total} of 100 tokens; "
        "resume with a larger --max-total-tokens"
    ) in said

    # The same budget again: said at once, nothing run, no model loaded.
    said.clear()
    run_campaign(config, store, CirclePacking(), say=said.append)
    assert said == [spend.stop_reason(config)] and store.iterations_done(campaign_id) == 1

    # Room for about one more iteration: it runs, then the budget stops it again.
    larger = build(settings(tiny_model, max_total_tokens=spend.total + 1))
    run_campaign(larger, store, CirclePacking(), say=said.append)
    assert store.iterations_done(campaign_id) == 2
    assert stored_spend(store, campaign_id).total >= spend.total + 1
    # Without a budget it finishes the iterations asked for.
    run_campaign(build(settings(tiny_model)), store, CirclePacking())
    assert store.iterations_done(campaign_id) == 4
    store.close()


def test_a_cost_budget_stops_the_campaign_and_vpo_run_prints_the_cost(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture
) -> None:
    db = tmp_path / "run.db"
    run = [
        "run", "circle_packing", "--db", str(db), "--model", tiny_model,
        "--backend", "transformers", "--iterations", "3", "--concurrency", "1",
        "-G", "2", "-m", "2", "--max-tokens", "24", "--workers", "2",
        "--price-prompt", "2", "--price-completion", "10",
    ]  # fmt: skip
    assert main([*run, "--max-cost", "0.0001"]) == 0  # 50 prompt tokens' worth
    out = capsys.readouterr().out
    store = Store.open(db)
    campaign = store.campaigns()[0]
    assert store.iterations_done(campaign.id) == 1
    spend = stored_spend(store, campaign.id)
    cost = (spend.prompt_tokens * 2 + spend.completion_tokens * 10) / 1e6
    assert f"cost budget reached: ${cost:.4f} of $0.0001; resume with a larger --max-cost" in out
    assert (
        f"cost: ${cost:.4f} for {spend.prompt_tokens} prompt and {spend.completion_tokens} "
        "completion tokens ($2 and $10 per million)"
    ) in out

    assert main([*run, "--max-cost", "1000"]) == 0
    assert store.iterations_done(campaign.id) == 3
    assert "budget reached" not in capsys.readouterr().out
    store.close()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--max-total-tokens", "0"], "'max_total_tokens' must be a whole number >= 1"),
        (["--max-total-tokens", "-5"], "'max_total_tokens' must be a whole number >= 1"),
        (["--max-cost", "0", "--price-prompt", "1"], "'max_cost' must be a number > 0"),
        (["--price-prompt", "-1"], "'price_prompt' must be a number > 0"),
        (["--price-completion", "0"], "'price_completion' must be a number > 0"),
        (["--price-completion", "nan"], "'price_completion' must be a number > 0"),
        (["--max-cost", "5"], "'max_cost' must be set together with price_prompt"),
    ],
)
def test_bad_budgets_and_prices_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], words: str
) -> None:
    db = tmp_path / "run.db"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "circle_packing", "--db", str(db), *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not db.exists() or Store.open(db).campaigns() == []


def test_budgets_come_from_a_toml_section(tmp_path: Path) -> None:
    from harness.config.files import load_toml

    file = tmp_path / "campaign.toml"
    file.write_text(
        "[budget]\nprice_prompt = 0.15\nprice_completion = 0.6\nmax_total_tokens = 1000000\n"
        "max_cost = 2.5\n"
    )
    config = build(load_toml(file))
    assert (config.price_prompt, config.price_completion) == (0.15, 0.6)
    assert (config.max_total_tokens, config.max_cost) == (1_000_000, 2.5)
    with pytest.raises(UserError, match="'max_total_tokens' must be a whole number"):
        build({"max_total_tokens": 1.5})


def usage_server(
    tokens: int, requests: list[int] | None = None
) -> Callable[[dict[str, object]], dict[str, object]]:
    """A server's answer without token ids: n one-candidate completions, each `tokens` long and
    its prompt 50 by the `usage` it reports; `requests` gets each request's n."""

    def answer(body: dict[str, object]) -> dict[str, object]:
        n = int(body.get("n", 1))  # type: ignore[call-overload]
        if requests is not None:
            requests.append(n)
        text = "<candidate_1>\n```python\ndef construct_packing(n):\n    return []\n```\n"
        choices = [
            {"index": i, "message": {"role": "assistant", "content": f"{text}{i}"},
             "finish_reason": "stop"}
            for i in range(n)
        ]  # fmt: skip
        return {"choices": choices, "usage": {"prompt_tokens": 50, "completion_tokens": tokens * n}}

    return answer


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_token_budget_at_a_server_without_token_ids_stops_within_one_batch(
    concurrency: int, tmp_path: Path
) -> None:
    """A server that returns no token ids (the OpenAI API, most servers) reports its tokens in
    `usage`: those count, so the budget stops the campaign at any concurrency, at most one
    batch past it, and says what was spent."""
    tokens = 10  # each completion's, as the server reports it
    answer = usage_server(tokens)
    said: list[str] = []
    budget = 100
    with chat_server(answer) as url, Store.open(tmp_path / "c.db") as store:
        config = build({
            "backend": "openai", "base_url": url, "api_key_env": "", "model": "m",
            "iterations": 40, "group_size": 2, "candidates": 1, "concurrency": concurrency,
            "token_budget": budget,
        })  # fmt: skip
        campaign_id = run_campaign(config, store, CirclePacking(), say=said.append)
        spent = store.summary(campaign_id).tokens
        done = store.iterations_done(campaign_id)
        # The prompts a server reported count too: 50 a request, one request a group.
        assert stored_spend(store, campaign_id).prompt_tokens == 50 * done
        assert f"token budget spent: {spent} of {budget} tokens generated" in said
        # `vpo status` says what stopped it, and gives no time left.
        report = status.progress(store, store.get_campaign("circle_packing"))
        assert report["stopped_by"] == f"token budget spent: {spent} of {budget} tokens generated"
        assert report["eta_s"] is None

        # A budget on everything paid for (prompts and completions), resumed: it stops once
        # the stored total reaches it, at most a batch past it.
        total = stored_spend(store, campaign_id).total
        bigger = build(config.to_dict(), {"iterations": 80, "token_budget": 0,
                                          "max_total_tokens": total + 300})  # fmt: skip
        said.clear()
        run_campaign(bigger, store, CirclePacking(), say=said.append)
        after = stored_spend(store, campaign_id)
        assert total + 300 <= after.total < total + 300 + concurrency * (50 + 2 * tokens)
        assert said[-1].startswith(f"token budget reached: {after.total} of {total + 300}")
    batch = concurrency * 2 * tokens  # the tokens of one batch in flight
    assert budget <= spent < budget + batch and spent == done * 2 * tokens
    assert done < 40


@pytest.mark.parametrize("concurrency", [1, 8])
def test_the_call_budget_is_iterations_one_request_each_at_any_concurrency(
    concurrency: int, tmp_path: Path
) -> None:
    """A call budget is `iterations`: each iteration asks the model once for its G rollouts
    (`n` = G), so a server sees exactly as many requests as iterations, with any number in
    flight, and a resume with a larger budget asks only for the new ones."""
    requests: list[int] = []
    answer = usage_server(10, requests)
    with chat_server(answer) as url, Store.open(tmp_path / "c.db") as store:
        config = build({
            "backend": "openai", "base_url": url, "api_key_env": "", "model": "m",
            "iterations": 11, "group_size": 3, "candidates": 1, "concurrency": concurrency,
            "retries": 0,
        })  # fmt: skip
        campaign_id = run_campaign(config, store, CirclePacking(), say=lambda _: None)
        assert requests == [3] * 11
        assert store.iterations_done(campaign_id) == 11
        run_campaign(build(config.to_dict(), {"iterations": 19}), store, CirclePacking(),
                     say=lambda _: None)  # fmt: skip
        assert requests == [3] * 19
