"""`autoscaler analyze`'s HTML report, rendered by a real headless Chromium, on the bundled recording (no
per-priority series) and the bundled trace: the page loads, its image and text are drawn (not a blank
page), the screenshot is kept next to the report for a person to look at, and the text as the browser
has it says what it should: a sentence where the data has no class breakdown, "never shed" (not what
shedding would save) for a class the policy never sheds, busy and slot use with what links them, and a
burst ceiling at or above the floor."""

import html
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from autoscaler.cli import main

from helpers import BUNDLED_TRACE, ROOT

BUNDLED = ROOT / "loadtest" / "recordings" / "fleet-3h" / "recording.json"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    # `make test` installs Debian's chromium; in CI a missing browser is a failure, not a skip
    (pytest.fail if os.environ.get("CI") else pytest.skip)("no Chromium on PATH (Debian: apt-get install chromium)")


def _render(browser: str, page, shot) -> str:
    """Screenshot the page into `shot`; return its DOM as the browser built it."""
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1280,2000", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=True).stdout


def _figures(dom: str) -> dict:
    """The report's own figures, from the "All figures" block of the rendered page."""
    block = dom.split("All figures</h2><pre>", 1)[1].split("</pre>", 1)[0]
    return json.loads(html.unescape(block))


@pytest.mark.parametrize("source", [BUNDLED, BUNDLED_TRACE.parent], ids=["recording", "trace"])
def test_the_report_renders_in_headless_chromium(source, tmp_path, capsys):
    browser = chromium()
    out = tmp_path / "analyze-out"
    assert main(["analyze", str(source), "--out", str(out)]) == 0
    capsys.readouterr()
    shot = out / "screenshot.png"
    dom = _render(browser, out / "report.html", shot)
    assert "Demand preflight" in dom and "<img" in dom
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    drawn = (pixels < 0.9).any(axis=2)  # anything darker than near-white: text, axes, bars
    assert drawn.mean() > 0.02, f"{shot}: {drawn.mean():.3%} of the page drawn"
    # the report's figure is drawn in the browser: rows of the page's upper half hold plotted colour
    colour = np.abs(pixels - pixels.mean(axis=2, keepdims=True)).max(axis=2) > 0.15
    assert colour[: pixels.shape[0] // 2].mean() > 0.001, f"{shot}: no coloured figure on the page"

    text = html.unescape(dom)
    a = _figures(dom)
    assert a["burst_ceiling"]["ceiling_replicas"] >= a["concurrency_floor"]["replicas"]
    classes_line = re.search(r"^4\. classes.*$", text, re.M).group(0)
    per = a["classes"]["per_class"]
    if not per:  # the class breakdown is not in the data: a sentence says so, no empty list
        assert "not in the data" in classes_line and "what can wait cannot be told" in classes_line
    for name, c in per.items():
        offer = re.search(rf"{name} \d+% of requests, ([^;]*)", classes_line).group(1)
        assert ("shedding it saves" in offer) == c["sheddable"], classes_line
        assert ("never shed" in offer) == (not c["sheddable"]), classes_line
    assert "a busy replica held" in re.search(r"^3\. residency.*$", text, re.M).group(0)
