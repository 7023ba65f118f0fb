"""The genealogy page and a program's story in a real headless Chromium, on conftest's small
campaign: `vpo ui` started as a user starts it (the fixtures of test_dashboard_browser)."""

from __future__ import annotations

import test_dashboard_browser as shared

from harness.records import NewProgram
from harness.store import Store

# The fixtures and helpers of the dashboard's browser test: `vpo ui` on conftest's small
# campaign, and the headless Chromium (skipped where it is not installed).
browser, server = shared.browser, shared.server
ARTIFACTS, _wait = shared.ARTIFACTS, shared._wait


def test_genealogy_page_draws_every_program_and_leads_to_its_page(
    server: str,
    browser: object,
) -> None:
    driver = browser
    driver.get(server + "#/tree")
    count = _wait(driver, "the tree", "return document.querySelectorAll('#tree circle').length")
    assert count == 5
    titles = driver.execute_script(
        "return [...document.querySelectorAll('#tree circle title')].map(t => t.textContent)"
    )
    assert any(t.startswith("program 5 · gen 2 · island 1 · policy version 0") for t in titles)
    # Parent edges, the one draft edge, and a best path per objective.
    counts = driver.execute_script(
        "return ['.tree-edge', '.tree-draft', '.tree-best'].map(s =>"
        " document.querySelectorAll('#tree ' + s).length)"
    )
    assert counts == [4, 1, 2]
    legend = driver.find_element("id", "tree-legend").text
    assert "a 0.9500: program 5" in legend and "b 0.9000: program 3" in legend
    assert "5 programs, all drawn" in driver.find_element("id", "tree-summary").text
    # Colour by the policy version: the seed is grey, the rollouts' programs are version 0's.
    driver.execute_script(
        "const s = document.getElementById('tree-color'); s.value = 'version';"
        " s.dispatchEvent(new Event('change'))"
    )
    legend = _wait(
        driver,
        "the version legend",
        "const t = document.getElementById('tree-legend').textContent;"
        " return t.includes('version 0 (base weights)') && t",
    )
    assert "seed or migrant" in legend
    # Without draft edges.
    driver.find_element("id", "tree-drafts").click()
    assert (
        driver.execute_script("return document.querySelectorAll('#tree .tree-draft').length") == 0
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "dashboard-genealogy.png"))
    # A node is a link to its program's page.
    driver.execute_script(
        "document.querySelector('#tree circle[data-id=\"5\"]')"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
    )
    _wait(
        driver,
        "program 5's page",
        "return document.getElementById('program-title').textContent === 'Program 5'",
    )
    assert driver.execute_script("return document.getElementById('tree-page').hidden")
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_program_page_tells_what_the_model_was_shown_and_wrote(
    server: str,
    browser: object,
    sqlite_database: str,
) -> None:
    driver = browser
    driver.get(server + "#/program/5")
    candidates = _wait(
        driver,
        "the rollout's candidates",
        "const t = document.getElementById('program-title');"
        " const rows = [...document.querySelectorAll('#story-candidates tbody tr')];"
        " return t.textContent === 'Program 5' && rows.length &&"
        " rows.map(r => [...r.cells].map(c => c.textContent))",
    )
    assert candidates[0][:4] == ["1", "new program", "5", "ok"]
    assert candidates[1][1] == "unparsed" and candidates[1][5] == "truncated"
    prompt = driver.execute_script(
        "return [...document.querySelectorAll('#story-prompt pre')].map(p => p.textContent)"
    )
    assert prompt == ["improve more"]
    version = driver.find_element("id", "story-version").text
    assert "policy version 0 (the base weights)" in version
    driver.save_screenshot(str(ARTIFACTS / "dashboard-story.png"))

    # Program 2's group had another rollout: a failed program and an unparsed slot.
    driver.get(server + "#/program/2")
    group = _wait(
        driver,
        "the group's other rollouts",
        "const t = document.getElementById('program-title');"
        " const rows = [...document.querySelectorAll('#story-group tbody tr')];"
        " return t.textContent === 'Program 2' && rows.length && rows.map(r => r.textContent)",
    )
    assert len(group) == 1 and "4 new" in group[0] and "unparsed" in group[0]

    # A failed program's evaluation: its error as a line, each stage's traceback as a code
    # block (not one escaped JSON line), other numbers as a table.
    traceback = (
        'Traceback (most recent call last):\n  File "<candidate>", line 3\nValueError: boom\n'
    )
    with Store.open(sqlite_database) as writer:
        failed = writer.add_program(
            1,
            NewProgram(
                "def f():\n    return -1\n",
                "error",
                {"a": 0.0, "b": 0.0},
                {},
                error="fit: ValueError: boom",
                metrics={
                    "artifacts": {"fit": {"seconds": 0.25, "stdout": "", "stderr": traceback}},
                    "evaluations": 59,
                },
            ),
        )
    driver.get(server + f"#/program/{failed}")
    shown = _wait(
        driver,
        "the failed program's evaluation",
        f"const t = document.getElementById('program-title');"
        f" const e = document.querySelector('#program-feedback p.error');"
        f" return t.textContent === 'Program {failed}' && e && [e.textContent,"
        f" [...document.querySelectorAll('#program-feedback pre')].map(p => p.textContent),"
        f" [...document.querySelectorAll('#program-feedback table td')].map(c => c.textContent)]",
    )
    assert shown == ["fit: ValueError: boom", [traceback], ["evaluations", "59"]]
    driver.save_screenshot(str(ARTIFACTS / "dashboard-evaluation.png"))
    # The seed has no rollout: no story, and the page says who wrote it.
    driver.get(server + "#/program/1")
    _wait(
        driver,
        "the seed's page",
        "return document.getElementById('program-title').textContent === 'Program 1'",
    )
    assert driver.execute_script("return document.getElementById('story').hidden")
    assert "the seed" in driver.find_element("id", "provenance").text
