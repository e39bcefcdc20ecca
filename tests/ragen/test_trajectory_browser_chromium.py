"""The trajectory browser in a real headless Chromium, served by `python -m http.server` as a user would.

Needs Debian's `chromium` and the `playwright` Python package (its driver only: the system browser is
used, no `playwright install`); skipped without them.
"""

import shutil
import subprocess
import sys

import pytest

from ragen.trajectory_browser import write_index, write_step
from tests.ragen.test_trajectory_browser import CUSTOM_ENVS, play

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (driver only)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary: apt-get install -y chromium")


@pytest.fixture
def served(tmp_path):
    """A log_image_dir with one experiment of two steps, served on a free port of 127.0.0.1."""
    log_dir = tmp_path / "log"
    experiment = log_dir / "exp"
    records = [play("SimpleSokoban", ["Up", "Left"], env_id=0, group_id=0, seed=0),
               play("SimpleSokoban", ["Down"], env_id=1, group_id=0, seed=0, reply="<answer>Down</answer> oops"),
               play("Bandit", ["dragon"], env_id=2, group_id=1, seed=1),
               play("Bandit", ["phoenix"], env_id=3, group_id=1, seed=1),
               play("FrozenLake", ["Right", "Down", "Down"], env_id=4, group_id=2, seed=0)]
    records[1]["turns"][0]["format_ok"] = False
    records[4] |= {"token_pieces": ["<b>", "Right", " & "],
                   "trained_tokens": {"spans": [[1, 3]], "advantages": [1, -0.5]}}
    later = play("Bandit", ["dragon"], env_id=0, group_id=0, seed=5, step=2)
    write_step(records, experiment, 1, -1, CUSTOM_ENVS)
    write_step([later], experiment, 2, -1, CUSTOM_ENVS)
    write_index(experiment)
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1"],
                              cwd=log_dir, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        port = int(line.split(" port ")[1].split()[0])
        yield f"http://127.0.0.1:{port}/exp/", records + [later]
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_index_filters_and_a_trajectory_page_render_in_chromium(served, tmp_path):
    url, records = served
    successes = {(1, r["env_id"]) for r in records if r["success"] and r["step"] == 1}
    assert 0 < len(successes) < 5  # the filter has something to keep and something to drop
    penalised = {(r["step"], r["env_id"]) for r in records if r["reward"] <= -0.15}
    assert 0 < len(penalised) < len(records)
    errors = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page()
        page.set_default_timeout(10_000)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)  # CSP violations too
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url + "index.html")

        def listed() -> set[tuple[int, int]]:
            cells = page.eval_on_selector_all("#list tbody tr:not([hidden])",
                                              "rows => rows.map(r => [r.cells[0].textContent, r.cells[2].textContent])")
            return {(int(step), int(env_id)) for step, env_id in cells}

        assert listed() == {(1, i) for i in range(5)} | {(2, 0)}
        page.select_option("select[name=success]", "1")
        page.select_option("select[name=step]", "1")
        assert listed() == successes
        assert page.text_content("#count") == f"{len(successes)} of 6 trajectories shown"
        page.click("button[type=reset]")
        page.fill("input[name=q]", "OOPS")  # search is over model output, ignoring case
        assert listed() == {(1, 1)}
        page.click("button[type=reset]")
        page.select_option("select[name=malformed]", "1")
        assert listed() == {(1, 1)}
        page.fill("input[name=tmin]", "2")  # env 1 played one turn
        assert listed() == set()
        page.click("button[type=reset]")
        page.fill("input[name=rmax]", "-0.15")
        assert listed() == penalised
        page.click("button[type=reset]")
        page.screenshot(path=tmp_path / "index.png", full_page=True)

        page.click("#list a >> text=FrozenLake")
        page.wait_for_load_state()
        assert page.url == url + "step_1/trajectory_data_4.html"
        widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert len(widths) == len(records[4]["turns"]) + 1 and all(w == 64 for w in widths)  # 4 cells of 16 px
        tokens = page.eval_on_selector_all("section.tokens pre span", "spans => spans.map(s => "
                                           "[s.textContent, getComputedStyle(s).backgroundColor])")
        assert tokens == [["<b>", "rgba(0, 0, 0, 0)"], ["Right", "rgba(33, 102, 172, 0.8)"],  # inline styles apply
                          [" & ", "rgba(178, 24, 43, 0.4)"]]
        page.screenshot(path=tmp_path / "trajectory.png", full_page=True)
        page.click("text=all trajectories")
        assert page.url == url + "index.html"
        browser.close()
    assert errors == []
    assert (tmp_path / "index.png").stat().st_size > 0 and (tmp_path / "trajectory.png").stat().st_size > 0
