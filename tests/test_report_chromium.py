"""`autoscaler analyze`'s HTML report, rendered by a real headless Chromium: the page loads, its image and
text are drawn (not a blank page), and the screenshot is kept next to the report for a person to look at."""

import os
import shutil
import subprocess

import numpy as np
import pytest

from autoscaler.cli import main

from helpers import ROOT

BUNDLED = ROOT / "loadtest" / "recordings" / "fleet-3h" / "recording.json"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    # `make test` installs Debian's chromium; in CI a missing browser is a failure, not a skip
    (pytest.fail if os.environ.get("CI") else pytest.skip)("no Chromium on PATH (Debian: apt-get install chromium)")


def test_the_report_renders_in_headless_chromium(tmp_path, capsys):
    browser = chromium()
    out = tmp_path / "analyze-out"
    assert main(["analyze", str(BUNDLED), "--out", str(out)]) == 0
    capsys.readouterr()
    page = out / "report.html"
    shot = out / "screenshot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1280,2000", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "Demand preflight" in dom and "<img" in dom
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    drawn = (pixels < 0.9).any(axis=2)  # anything darker than near-white: text, axes, bars
    assert drawn.mean() > 0.02, f"{shot}: {drawn.mean():.3%} of the page drawn"
    # the report's figure is drawn in the browser: rows of the page's upper half hold plotted colour
    colour = np.abs(pixels - pixels.mean(axis=2, keepdims=True)).max(axis=2) > 0.15
    assert colour[: pixels.shape[0] // 2].mean() > 0.001, f"{shot}: no coloured figure on the page"
