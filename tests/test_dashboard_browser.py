"""The dashboard in a real headless Chromium: `vpo ui` started as a user starts it, the page
drawn, kept live while the campaign writes, and hostile program text shown as text.

Needs Debian's `chromium` and `chromium-driver` (`make test` installs them) and selenium. Without
them the test is skipped, unless $VPO_REQUIRE_BROWSER=1 (CI sets it) makes that a failure.
Screenshots go to $VPO_ARTIFACTS (default: artifacts/ in the repository).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.records import CandidateRecord, NewGroup, NewProgram, RolloutRecord
from harness.store import Store

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(os.environ.get("VPO_ARTIFACTS", Path(__file__).parents[1] / "artifacts"))


def _need_browser() -> None:
    missing = [
        name for name, found in (("chromium", CHROMIUM), ("chromedriver", DRIVER)) if not found
    ]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
    if missing:
        reason = f"{', '.join(missing)} not installed; `make test` installs them"
        if os.environ.get("VPO_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def server(sqlite_database: str) -> Iterator[str]:
    yield from serve_ui(sqlite_database)


def serve_ui(database: str) -> Iterator[str]:
    """`vpo ui` on `database` as a user starts it; its address until the test ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "ui", "--db", database, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"vpo ui did not start: {process.stdout.read()}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def browser() -> Iterator[object]:
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1800")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: object, what: str, script: str, timeout: float = 30) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_dashboard_in_chromium(
    server: str, browser: object, sqlite_database: str, hostile_code: str
) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    driver = browser
    driver.get(server)
    # Tables filled and plots drawn.
    rows = _wait(
        driver,
        "the top table",
        "return document.querySelectorAll('#top tbody tr').length",
    )
    assert rows == 4
    first = driver.execute_script(
        "return [...document.querySelectorAll('#top tbody tr')[0].cells].map(c => c.textContent)"
    )
    assert first[:3] == ["1", "5", "0.5750"]
    plots = driver.execute_script(
        "return [...document.querySelectorAll('.plot')].map(p => ["
        " p.querySelector('h3').textContent,"
        " p.querySelectorAll('circle').length, p.querySelectorAll('path').length])"
    )
    titles = [title for title, _, _ in plots]
    assert titles[:2] == ["Best value per objective", "Pareto front: a vs b"]
    by_title = {title: (circles, paths) for title, circles, paths in plots}
    assert by_title["Best value per objective"] == (5, 2)  # a: 3 records, b: 2; one line each
    assert by_title["Pareto front: a vs b"] == (4 + 3, 1)  # the cloud and the front
    assert by_title["Programs stored"][1] == 1
    # Iteration 0 has a pool diversity, both have a parse rate: three dots, two rolling means.
    assert by_title["Pool diversity and parse rate per iteration"] == (3, 2)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "dashboard-overview.png"))

    # Live: a program the campaign stores now shows up without a reload.
    with Store.open(sqlite_database) as writer:
        writer.add_program(
            1, NewProgram("def f():\n    return 99\n", "ok", {"a": 0.99, "b": 0.99}, {})
        )
    _wait(
        driver,
        "the new program",
        "return document.querySelector('#top tbody tr td:nth-child(2)').textContent === '6'",
        timeout=30,
    )
    assert "6" in driver.find_element("id", "summary").text
    # How it is going: the candidates rejected and why (two unparsed slots, one error).
    rejected = driver.execute_script(
        "const c = [...document.querySelectorAll('.card')].find(c => c.querySelector('.label')"
        ".textContent === 'rejected candidates'); return [c.querySelector('.value').textContent,"
        " c.querySelector('.detail').textContent]"
    )
    assert rejected == ["3 of 6", "unparsed 2 · error 1"]

    # Training steps the campaign records: a chart per metric, a dot per step and series.
    with Store.open(sqlite_database) as writer:
        for step in (1, 2):
            metrics = {
                name: value * step
                for name, value in (
                    ("loss", 0.5),
                    ("policy_loss", 0.4),
                    ("kl", 1e-3),
                    ("grad_norm", 1.5),
                    ("clip_fraction", 0.1),
                    ("set_score", 0.3),
                    ("diversity", 0.2),
                    ("staleness", 0.5),
                )
            }
            version = writer.record_train_step(
                1, step=step, path=f"s{step}", metrics={"step": step, **metrics}, group_ids=[step]
            )
    training = _wait(
        driver,
        "the training charts",
        "const t = [...document.querySelectorAll('.plot')].filter(p => p.querySelector('h3')"
        ".textContent.startsWith('Training: ')); return t.length === 6 && t.map(p =>"
        " [p.querySelector('h3').textContent, p.querySelectorAll('circle').length,"
        " p.querySelectorAll('path.line').length])",
    )
    assert dict((title, (dots, lines)) for title, dots, lines in training) == {
        "Training: loss": (4, 2),
        "Training: KL to the reference": (2, 1),
        "Training: gradient norm": (2, 1),
        "Training: clip fraction": (2, 1),
        "Training: set score and diversity": (4, 2),
        "Training: staleness": (2, 1),
    }
    driver.save_screenshot(str(ARTIFACTS / "dashboard-training.png"))

    # A group the trained weights (version 2) sampled: the share of rollouts they sampled, and
    # what each version sampled (the start: three rollouts, parse rate 3/4 and 1/2).
    with Store.open(sqlite_database) as writer:
        program = NewProgram("def f():\n    return 21\n", "ok", {"a": 0.3, "b": 0.35}, {})
        writer.record_iteration(
            1,
            NewGroup(
                iteration=2,
                island=0,
                parent_id=1,
                draft_ids=(),
                prompt=[{"role": "user", "content": "improve again"}],
                prompt_token_ids=[8],
                rollouts=[
                    RolloutRecord(
                        "text",
                        [1, 2],
                        [-0.1, -0.2],
                        "stop",
                        "ok",
                        None,
                        [CandidateRecord(1, "new", program), CandidateRecord(2, "new", program)],
                    )
                ],
                version=version,
            ),
        )
    versions = _wait(
        driver,
        "the versions table",
        "const t = document.getElementById('versions-table'); return t && !t.closest('[hidden]')"
        " && t.querySelectorAll('tbody tr').length === 2 && [...t.querySelectorAll('tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent))",
    )
    assert versions[0][:3] == ["0 (start)", "2", "3"]
    assert versions[1][:3] == ["2", "1", "1"] and versions[1][-2:] == ["0.3000", "0.3500"]
    share = driver.execute_script(
        "const c = [...document.querySelectorAll('.card')].find(c => c.querySelector('.label')"
        ".textContent === 'sampled by trained weights'); return c.querySelector('.value')"
        ".textContent"
    )
    assert share == "1 of 4 (25%)"
    # A campaign a budget finished early: the iterations card says which budget.
    with Store.open(sqlite_database) as writer:
        writer.set_campaign_status(1, "finished", "token budget spent: 60 of 50 tokens generated")
    stopped = _wait(
        driver,
        "the budget that stopped it",
        "const c = [...document.querySelectorAll('.card')].find(c => c.querySelector('.label')"
        ".textContent === 'iterations'); const d = c && c.querySelector('.detail');"
        " return d && d.textContent",
    )
    assert stopped == "stopped by token budget spent: 60 of 50 tokens generated"

    # A record above the best known value (1): its card says so, the best-value plot draws the
    # best known value to compare, and its scores are marked in the tables.
    with Store.open(sqlite_database) as writer:
        record = writer.add_program(
            1, NewProgram("def f():\n    return 120\n", "ok", {"a": 1.2, "b": 0.5}, {})
        )
    note = _wait(
        driver,
        "the record's card",
        "const n = document.querySelector('.card.record .note'); return n && n.textContent",
    )
    assert note == "record: +20.0% over best known"
    assert (
        driver.execute_script(
            "return [...document.querySelectorAll('.plot')].find(p => p.querySelector('h3')"
            ".textContent === 'Best value per objective').querySelectorAll('path.reference').length"
        )
        == 1
    )
    driver.execute_script(
        "const s = document.getElementById('rank'); s.value = 'objective:a';"
        " s.dispatchEvent(new Event('change'))"
    )
    cell = _wait(
        driver,
        "the record at the top",
        f"const r = document.querySelector('#top tbody tr'); return r && r.dataset.id === "
        f"'{record}' && r.querySelector('td.record') && r.querySelector('td.record').title",
    )
    assert cell == "record: +20.0% over best known"
    driver.save_screenshot(str(ARTIFACTS / "dashboard-record.png"))

    # A program whose code is markup: shown as text, never run.
    driver.get(server + "#/program/4")
    code = _wait(
        driver,
        "the program's code",
        "const c = document.getElementById('program-code'); return c && c.textContent",
    )
    assert code == hostile_code
    assert driver.find_element("id", "program-title").text == "Program 4"
    assert driver.execute_script("return document.scripts.length") == 2  # app.js, search.js
    assert driver.execute_script("return document.querySelectorAll('pre script').length") == 0
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018
    _wait(driver, "the lineage", "return document.querySelectorAll('#lineage .node').length")
    driver.save_screenshot(str(ARTIFACTS / "dashboard-program.png"))

    # A program with a parent: the diff and the lineage tree. Program 4's page is still shown
    # until program 5's arrives: wait for program 5's own title, diff and lineage.
    driver.get(server + "#/program/5")
    diff = _wait(
        driver,
        "program 5's diff",
        "const t = document.getElementById('program-title'), d = "
        "document.getElementById('program-diff'); return t && t.textContent === 'Program 5' && "
        "d && d.textContent.includes('+++ program 5') && d.textContent",
    )
    assert "+    return 11" in diff
    _wait(
        driver,
        "program 5's lineage",
        "return [...document.querySelectorAll('#lineage .node text')]"
        ".some(t => t.textContent.startsWith('5 ·'))",
    )
    nodes = driver.execute_script(
        "return [...document.querySelectorAll('#lineage .node text')].map(t => t.textContent)"
    )
    assert any(n.startswith("5 ·") for n in nodes) and "draft 3" in nodes

    # The record's own page marks its score.
    driver.get(server + f"#/program/{record}")
    scores = _wait(
        driver,
        "the record's scores",
        "const c = document.querySelector('#program-scores td.record'); return c && c.textContent",
    )
    assert scores == "1.2000 (record: +20.0% over best known)"
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
