"""The overview page of a finished equation-discovery campaign in headless Chromium: it says
"finished", not live; a best value the seed still holds says so; the top table shows each
program's expression (as text, the code on hover); the per-iteration chart marks where each
policy version first sampled; every y-axis names what it shows; an objective held at 0 is
explained in the problem's words. Screenshots go to artifacts/ (as test_dashboard_browser's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import test_dashboard_browser as shared
from test_plots import PROBLEM, equation_campaign

from harness.observation.dashboard import Dashboard
from harness.records import NewProgram
from harness.store import Store

browser = shared.browser  # the headless Chromium fixture, skipped where it is not installed
_wait = shared._wait


@pytest.fixture
def campaign_db(tmp_path: Path) -> str:
    url = equation_campaign(tmp_path / "eq.db")
    with Store.open(url) as store:
        # Markup as code: the table must show it as text.
        store.add_program(1, NewProgram("<img src=x onerror=alert(1)>", "ok", _low(), {}))
    return url


def _low() -> dict[str, float]:
    return {"fit_id": 0.01, "fit_ood": 0.01, "simplicity": 0.0}


@pytest.fixture
def server(campaign_db: str) -> Iterator[str]:
    yield from shared.serve_ui(campaign_db)


def test_overview_says_the_seed_the_versions_and_each_programs_expression(
    campaign_db: str,
) -> None:
    with Store.open(campaign_db) as store:
        view = Dashboard(store).view(None)
        overview = view.overview()
        top = view.top(n=10)
        by_fit = view.top(objective="fit_id", n=1)
    assert overview["best"]["fit_id"]["program_id"] == 1
    assert overview["best_origin"] == {"fit_id": "seed", "fit_ood": "llm", "simplicity": "seed"}
    assert overview["version_starts"] == [[2, 1], [3, 2]]
    assert "predicting the mean" in overview["notes"]["simplicity"]
    gists = {row["id"]: row["gist"] for row in top}
    assert gists[1] == {
        "kind": "expression",
        "text": "params[0] * x + params[1] * v + params[2]",
        "code": gists[1]["code"],
    }
    assert "def equation(x, v, params):" in gists[1]["code"]
    assert by_fit[0]["id"] == 1 and by_fit[0]["gist"]["kind"] == "expression"


def test_finished_campaign_overview_in_chromium(server: str, browser: object) -> None:
    driver = browser
    driver.get(server)
    _wait(driver, "the top table", "return document.querySelectorAll('#top tbody tr').length")
    live = _wait(
        driver,
        "the live indicator",
        "const l = document.getElementById('live'); return l.textContent.includes('updated')"
        " && [l.textContent, l.className]",
    )
    assert live[0].startswith("finished · updated") and live[1] == "live done"

    seed = driver.execute_script(
        "const c = [...document.querySelectorAll('.card')].find(c => c.querySelector('.label')"
        ".textContent === 'best fit_id'); return [c.className, c.querySelector('a')"
        ".getAttribute('href'), c.querySelector('.detail').textContent]"
    )
    assert seed == ["card seed", "#/program/1", "program 1 is still the seed: nothing beat it"]
    other = driver.execute_script(
        "const c = [...document.querySelectorAll('.card')].find(c => c.querySelector('.label')"
        ".textContent === 'best fit_ood'); return [c.className, c.querySelector('.detail')]"
    )
    assert other == ["card", None]

    # The top table: the seed's expression, its code on hover; markup stays text.
    cells = driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#top tbody tr')].map(r =>"
        " [r.dataset.id, [r.lastElementChild.textContent, r.lastElementChild.title,"
        " r.lastElementChild.className]]))"
    )
    text, title, kind = cells["1"]
    assert text == "params[0] * x + params[1] * v + params[2]" and kind == "gist text expression"
    assert title.startswith("import numpy as np") and "def equation(x, v, params):" in title
    assert cells["7"][0] == "<img src=x onerror=alert(1)> … (1 lines)"
    assert driver.execute_script("return document.querySelectorAll('#top img').length") == 0
    header = driver.execute_script(
        "return document.querySelector('#top thead tr').lastChild.textContent"
    )
    assert header == "program"

    plots = driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('.plot')].map(p =>"
        " [p.querySelector('h3').textContent, {"
        " ylabel: p.querySelector('svg > text[transform]') &&"
        " p.querySelector('svg > text[transform]').textContent,"
        " versions: p.querySelectorAll('line.version').length,"
        " labels: [...p.querySelectorAll('text.version')].map(t => t.textContent),"
        " notes: [...p.querySelectorAll('.plot-note')].map(n => n.textContent)}]))"
    )
    measures = plots["Pool diversity and parse rate per iteration"]
    assert measures["versions"] == 2 and measures["labels"] == ["v1", "v2"]
    assert all(p["ylabel"] not in ("value", "") for p in plots.values() if p["ylabel"] is not None)
    assert "Training: KL to the reference" not in plots  # kl held 0: left out, and said so
    held = driver.execute_script("return document.getElementById('training-held').textContent")
    assert held == "Training charts left out, the same at every step: kl 0."

    from problems.registry import load

    why = load(PROBLEM).objective("simplicity").description
    assert (
        f"simplicity is 0 for every valid program: {why}"
        in plots["Pareto front: fit_id vs simplicity"]["notes"]
    )
    assert plots["Best value per objective"]["notes"] == [
        f"simplicity is 0 for every valid program: {why}"
    ]
    shared.ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(shared.ARTIFACTS / "overview-finished.png"))
    driver.execute_script("document.getElementById('top').scrollIntoView()")
    driver.save_screenshot(str(shared.ARTIFACTS / "overview-top-programs.png"))
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
