"""Progress on a terminal, quiet in CI: the decision (`autoscaler.progress.enabled`), the bars of replay,
analyze, the benchmark (per policy) and its frontier sweep under a real pseudo-terminal and through a
pipe, and the Makefile's pip flags."""

import fcntl
import io
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios

import pytest

from autoscaler.progress import NoBar, bar, enabled

from helpers import BUNDLED_TRACE, ROOT

RECORDING = ROOT / "loadtest" / "recordings" / "fleet-3h" / "recording.json"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_decision():
    assert enabled(_Terminal(), environ={})
    assert not enabled(_Terminal(), environ={"CI": "true"})
    assert enabled(_Terminal(), environ={"CI": ""})  # unset or empty: not CI
    assert not enabled(io.StringIO(), environ={})  # piped or redirected
    closed = open(os.devnull, "w")
    closed.close()
    assert not enabled(closed, environ={})  # isatty raises on a closed stream
    assert isinstance(bar(total=3, label="x", stream=io.StringIO()), NoBar)


def _run(argv: list[str], *, terminal: bool, ci: bool) -> tuple[int, str, str]:
    """Run with stdout piped and stderr on a pseudo-terminal (or a pipe); return (code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
    if not terminal:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        return done.returncode, done.stdout, done.stderr
    leader, follower = pty.openpty()
    # a terminal's size, as a window gives it (a fresh pseudo-terminal has 0 columns: tqdm would draw nothing)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, env=env, cwd=ROOT)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    out = proc.communicate(timeout=300)[0].decode()
    os.close(leader)
    return proc.returncode, out, seen.decode(errors="replace")


COMMANDS = {
    "replay": ([sys.executable, "-m", "autoscaler", "replay", str(RECORDING), "--no-plot"], "replay"),
    "analyze": ([sys.executable, "-m", "autoscaler", "analyze", str(BUNDLED_TRACE), "--json"], "analyze"),
    "bench": ([sys.executable, "-m", "loadtest.bench", "--policies", "static", "--json"], "static"),
    "frontier": ([sys.executable, "-m", "loadtest.bench", "--frontier", "--policies", "static", "--workers", "1"],
                 "frontier"),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_bar_on_a_terminal_none_in_ci_or_through_a_pipe(name, tmp_path):
    argv, label = COMMANDS[name]
    if name == "replay":
        argv = argv + ["--out", str(tmp_path / "replay-out")]
    code, out_tty, err = _run(argv, terminal=True, ci=False)
    assert code == 0 and f"{label}:" in err, err  # tqdm's "<label>: NN%|..."
    code, out_ci, err = _run(argv, terminal=True, ci=True)
    assert code == 0 and f"{label}:" not in err, err
    code, out_pipe, err = _run(argv, terminal=False, ci=False)
    assert code == 0 and "%|" not in err, err
    same = {re.sub(r'"wall_s": [0-9.]+', '"wall_s": _', out) for out in (out_pipe, out_tty, out_ci)}
    assert len(same) == 1  # stdout unchanged by the bars (but for the benchmark's measured wall time)


@pytest.mark.skipif(not shutil.which("make"), reason="no make")
def test_the_install_is_quiet_only_off_a_terminal_or_in_ci():
    argv = ["make", "-s", "--no-print-directory", "pip-flags"]
    assert _run(argv, terminal=True, ci=False)[1].split() == ["pip", "install"]
    assert _run(argv, terminal=True, ci=True)[1].split() == ["pip", "install", "--quiet"]
    assert _run(argv, terminal=False, ci=False)[1].split() == ["pip", "install", "--quiet"]
