"""`python -m loadtest.replay_digest`: the same replay prints the same digest, a changed decision another."""

import re
from dataclasses import replace

from loadtest import policyset, replay_digest


def _digests(capsys, argv):
    assert replay_digest.main(argv) == 0
    return dict(line.split() for line in capsys.readouterr().out.splitlines())


def test_the_same_replay_prints_the_same_digest_and_one_replica_more_changes_it(capsys, monkeypatch):
    argv = ["--policies", "predictive,static"]
    first = _digests(capsys, argv)
    assert set(first) == {"predictive", "static"}
    assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in first.values()), first
    assert _digests(capsys, argv) == first

    built = policyset.build

    def one_more_at_tick_100(*args, **kwargs):
        runs = built(*args, **kwargs)
        decide = runs[0].decide

        def changed(spec, state, signals, now):
            decision, state = decide(spec, state, signals, now)
            return (replace(decision, replicas=decision.replicas + 1) if now == 1500.0 else decision), state

        return [replace(runs[0], decide=changed)] + runs[1:]

    monkeypatch.setattr(policyset, "build", one_more_at_tick_100)
    changed = _digests(capsys, argv)
    assert changed["static"] == first["static"] and changed["predictive"] != first["predictive"]


def test_replay_digest_rejects_a_missing_trace(capsys, tmp_path):
    assert replay_digest.main(["--trace", str(tmp_path / "none.csv")]) == 2
    assert "error:" in capsys.readouterr().err
