"""benchmarks/atari_scores.py: CleanRL's per-game lines grouped into windows of env steps as
fusedrl's log points group their games, checked on hand-made logs."""

from __future__ import annotations

import json

import pytest

from benchmarks import atari_scores


def test_windows_of_cleanrl_games_and_fusedrl_log_points(tmp_path, capsys):
    log = tmp_path / "cleanrl.log"
    log.write_text(
        "global_step=8, episodic_return=[2.]\nSPS: 10\n"  # window 1 (steps 1-10)
        "global_step=10, episodic_return=4.0\n"  # window 1: its last step
        "global_step=11, episodic_return=[7.]\n"  # window 2
        "global_step=27, episodic_return=[9.]\n"  # window 3, unfinished (ends at 30)
    )
    windows, last = atari_scores.cleanrl_windows(log, window=10)
    assert windows == {1: (3.0, 2), 2: (7.0, 1), 3: (9.0, 1)} and last == 27
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"log_point": k, "step": 10 * (k + 1), "episode_return": float(k), "episodes": 5}
        for k in range(3)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    atari_scores.main([str(log), str(run), "--window", "10", "--points", "1,3,4"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| source | score to 0.00M frames")
    assert lines[2] == "| cleanrl.log | 3.00 (2) | 9.00 (1, to step 27) | - | 27 |"
    assert lines[3] == "| run | 0.00 (5) | 2.00 (5) | - | 30 |"
    with pytest.raises(SystemExit, match="set --window"):
        atari_scores.fusedrl_windows(run, window=20)
