"""The viewer in a real headless Chromium: token classes are styled, the search box filters.

Needs Debian's `chromium` + `chromium-driver` and `selenium` (scripts/tools/install_browser.sh);
skipped with the reason when they are missing. Runs on a small fake run and on a real 2-step run of the tiny model; set
AJET_VIEWER_RUN_DIR to a real run directory to check the viewer of that run instead.
Set AJET_VIEWER_SCREENSHOT=FILE.png to keep a screenshot of the opened episode.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ajet.outputs.metrics import read_jsonl
from ajet.outputs.viewer import QUERY_CHARS, step_files, token_classes, write_viewer

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,900"]


def fake_run(root: Path) -> Path:
    run = root / "exp" / "browser_demo"
    (run / "records").mkdir(parents=True)
    words = ["<|im_start|>", "user", "\n", "What", " is", " 2", "+", "3", "?", "<|im_end|>", "\n",
             "<|im_start|>", "assistant", "\n", "It", " is", " 5", ".", "<|im_end|>"]
    mask = [0] * 14 + [1] * 5

    def rec(step: int, episode: str, task: str, role: str, mask: list[int], tokens: list[str]) -> dict:
        n = len(tokens)
        return {"step": step, "episode_id": episode, "task_id": task, "group_id": task, "role": role,
                "reward": 1.0 if task != "t2" else 0.0, "is_success": task != "t2", "query": "What is 2+3?",
                "input_ids": list(range(1, n + 1)), "tokens": tokens, "loss_mask": mask,
                "logprobs": [-0.25 * m for m in mask], "advantages": [0.5 * m for m in mask],
                "segments": [[14, 19]] if any(mask) else []}

    steps = {
        1: [rec(1, "t1-e0", "t1", "default", mask, words), rec(1, "t1-e0", "t1", "judge", [0] * 4, ["ok", " ", "fine", "."]),
            rec(1, "t2-e0", "t2", "default", mask, words[:-5] + [" zebra", " stripes", " are", " odd", "<|im_end|>"])],
        2: [rec(2, "t1-e1", "t1", "default", mask, words), rec(2, "t3-e0", "t3", "default", mask, words)],
    }
    for step, recs in steps.items():
        (run / "records" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run / "FAKE_RUN").write_text("made by fake_run: its text is known\n")
    return run


def real_tiny_run(root: Path, model_dir: Path) -> Path:
    """Two real training steps of the debug backbone on the tiny model (the CLI, as a user runs it)."""
    from test_debug_backbone import ajet, make_run

    conf = make_run(root, model_dir)
    result = ajet("--conf", str(conf), "trainer.val_every=0")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "exp" / "tiny"


@pytest.fixture(params=["fake", "real"])
def run_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if os.environ.get("AJET_VIEWER_RUN_DIR"):
        return Path(os.environ["AJET_VIEWER_RUN_DIR"])
    if request.param == "real":
        if not (CHROMIUM and CHROMEDRIVER):
            pytest.skip("chromium/chromedriver missing: run scripts/tools/install_browser.sh")
        return real_tiny_run(tmp_path, request.getfixturevalue("tiny_model_dir"))
    return fake_run(tmp_path)


@pytest.fixture
def driver(tmp_path: Path):
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("needs Debian's chromium and chromium-driver: run scripts/tools/install_browser.sh")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium: run scripts/tools/install_browser.sh")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    # An explicit driver path: Selenium never tries to download a driver or browser.
    drv = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def open_viewer(driver, run_dir: Path, tmp_path: Path) -> None:
    page = write_viewer(run_dir, tmp_path / "viewer" / "index.html")
    driver.get(page.as_uri())
    driver.find_element("id", "search")  # the page loaded and rendered its list


def test_trained_tokens_are_styled_and_hover_shows_token_details(driver, run_dir: Path, tmp_path: Path):
    from selenium.webdriver.common.action_chains import ActionChains

    records = {step: read_jsonl(path) for step, path in step_files(run_dir).items()}
    step, rec = next((s, r) for s, recs in records.items() for r in recs
                     if {"trained", "context"} <= set(token_classes(r)))
    open_viewer(driver, run_dir, tmp_path)
    driver.execute_script("select(arguments[0], arguments[1])", step, rec["episode_id"])

    trained = driver.find_elements("css selector", ".tok.trained")
    context = driver.find_elements("css selector", ".tok.context")
    assert trained and context
    assert trained[0].get_attribute("class") == "tok trained"
    bg_trained = trained[0].value_of_css_property("background-color")
    bg_context = context[0].value_of_css_property("background-color")
    assert bg_trained != bg_context, (bg_trained, bg_context)
    if rec["segments"]:
        labels = [el.text for el in driver.find_elements("css selector", ".seg-label")]
        assert labels[0] == "call 1"

    ActionChains(driver).move_to_element(trained[0]).perform()
    tip = driver.find_element("id", "tip")
    assert tip.is_displayed()
    i = int(trained[0].get_attribute("data-i"))
    sample = driver.execute_script("return shown[Number(arguments[0].parentElement.dataset.s)]", trained[0])
    assert sample["episode_id"] == rec["episode_id"]
    assert f"id {sample['ids'][i]}" in tip.text and "logprob" in tip.text and "advantage" in tip.text
    if os.environ.get("AJET_VIEWER_SCREENSHOT"):
        driver.save_screenshot(os.environ["AJET_VIEWER_SCREENSHOT"])


def expected_matches(records: dict[int, list[dict]], query: str) -> set[tuple[int, str]]:
    """The search rule, restated: task id, episode id, query (as indexed), role or token text."""
    q, hits = query.lower(), set()
    for step, recs in records.items():
        for r in recs:
            fields = [r["episode_id"], r["task_id"], str(r.get("query") or "")[:QUERY_CHARS], r["role"]]
            meta = "\0".join(str(f) for f in fields)
            if q in meta.lower() or q in "".join(r["tokens"]).lower():
                hits.add((step, str(r["episode_id"])))
    return hits


def test_search_box_filters_the_episode_list(driver, run_dir: Path, tmp_path: Path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    records = {step: read_jsonl(path) for step, path in step_files(run_dir).items()}
    total = {(s, str(r["episode_id"])) for s, recs in records.items() for r in recs}
    ids = sorted({str(r["task_id"]) for recs in records.values() for r in recs}, reverse=True)
    ids += sorted({str(r["episode_id"]) for recs in records.values() for r in recs}, reverse=True)
    selective = [q for q in ids if 0 < len(expected_matches(records, q)) < len(total)]
    if not selective:
        pytest.skip("every id matches every episode of this run: nothing to filter")
    open_viewer(driver, run_dir, tmp_path)

    def rows() -> set[tuple[int, str]]:
        return {(int(el.get_attribute("data-step")), el.get_attribute("data-e"))
                for el in driver.find_elements("css selector", ".ep")}

    # Every query: the rendered rows are exactly the episodes the rule says match.
    queries = selective[:1] + (["ZEBRA"] if (run_dir / "FAKE_RUN").exists() else [])
    for query in queries:
        expected = expected_matches(records, query)
        assert expected and expected < total, f"{query!r} should match some, not all, episodes"
        box = driver.find_element("id", "search")
        box.clear()
        box.send_keys(query)
        # The list re-renders while the wait polls it: a row read mid-render is stale, so poll again.
        WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d, want=expected: rows() == want)
        assert f"{len(expected)} of {len(total)} episodes match" in driver.find_element("id", "count").text

    driver.find_element("id", "search").clear()
    driver.execute_script("document.getElementById('search').dispatchEvent(new Event('input'))")
    WebDriverWait(driver, 30).until(lambda d: "episodes match" not in d.find_element("id", "count").text)
