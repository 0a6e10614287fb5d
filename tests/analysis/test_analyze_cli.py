"""Tests of ``mtgrpo analyze`` (alias ``thm3-check``): exit codes, outputs, input errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mtgrpo.analysis import DEFAULT_BAND, save_rollouts_npz
from mtgrpo.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _report(out: Path) -> dict:
    return json.loads((out / "analysis.json").read_text(encoding="utf-8"))


def test_default_synthetic_check_passes_and_writes_report_and_plot(tmp_path: Path, capsys):
    out = tmp_path / "run"
    assert main(["analyze", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "PASS: NA realised / predicted" in printed
    assert "Per-channel influence" in printed
    report = _report(out)
    assert report["passed"] is True
    assert report["band"] == list(DEFAULT_BAND)
    assert report["source"]["kind"] == "synthetic"
    assert report["source"]["correlation"] == [[1, 0.5, 0], [0.5, 1, 0], [0, 0, 1]]
    assert report["config"]["num_prompts"] == 40
    assert report["config"]["num_seeds"] == 200
    assert report["config"]["group_size"] == 8
    assert report["config"]["weights"] == [1.0, 1.0, 0.5]
    assert 0.85 <= report["summary"]["na"]["ratio"] <= 1.15
    assert len(report["per_prompt"]["realised_na"]) == 40
    plot = (out / "money_plot.png").read_bytes()
    assert plot.startswith(PNG_SIGNATURE)
    assert len(plot) > 20_000  # two panels with points, bars and text, not an empty canvas


def test_alias_and_options_reach_the_analysis(tmp_path: Path):
    args = ["thm3-check", "--correlation", "1,0.3;0.3,1", "--prompts", "5", "--seeds", "30",
            "-m", "6", "--weights", "2,1", "--marginals", "gaussian,uniform:3",
            "--seed", "4", "--out", str(tmp_path), "--no-plot", "--band", "0.5,1.5"]
    assert main(args) == 0
    report = _report(tmp_path)
    assert (report["config"]["num_prompts"], report["config"]["num_seeds"]) == (5, 30)
    assert report["config"]["group_size"] == 6
    assert report["config"]["weights"] == [2.0, 1.0]
    assert report["config"]["seed"] == 4
    assert [m["kind"] for m in report["source"]["marginals"]] == ["gaussian", "uniform"]
    assert report["band"] == [0.5, 1.5]
    assert not (tmp_path / "money_plot.png").exists()


def _crafted_rollouts(path: Path) -> Path:
    # One prompt, two groups: the realised MSE is the sample variance of just two draws of ĝ,
    # so with --seed 1 it lands far below its expectation (ratio ≈ 0.008).
    rows = [[[1, 0.2], [0, 0.9], [1, 0.4], [0, 0.1]], [[0, 0.5], [1, 0.3], [1, 0.8], [0, 0.6]]]
    lines = [json.dumps({"step": s, "prompt_id": "q", "task": "t", "channels": ["c", "f"],
                         "rewards": group, "advantages": [0] * 4})
             for s, group in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_out_of_band_ratio_exits_1(tmp_path: Path, capsys):
    rollouts = _crafted_rollouts(tmp_path / "rollouts.jsonl")
    out = tmp_path / "fail"
    code = main(["analyze", "--rollouts", str(rollouts), "--seed", "1", "--out", str(out),
                 "--no-plot"])
    assert code == 1
    assert "FAIL: NA realised / predicted" in capsys.readouterr().out
    report = _report(out)
    assert report["passed"] is False
    assert report["summary"]["na"]["ratio"] < 0.85
    assert report["source"]["kind"] == "rollouts"
    assert report["config"]["channels"] == ["c", "f"]
    # the same rollouts pass when the band is wide enough: the exit code follows the band
    wide = ["analyze", "--rollouts", str(rollouts), "--seed", "1", "--out", str(out),
            "--no-plot", "--band", "0.001,10"]
    assert main(wide) == 0


def test_npz_rollouts_use_the_file_weights(tmp_path: Path):
    rewards = np.random.default_rng(0).normal(size=(4, 50, 5, 2)) * [1.0, 3.0]
    path = save_rollouts_npz(tmp_path / "r.npz", rewards, weights=[0.5, 2.0],
                             channels=["a", "b"])
    assert main(["analyze", "--rollouts", str(path), "--out", str(tmp_path), "--no-plot",
                 "--band", "0.7,1.3"]) == 0
    report = _report(tmp_path)
    assert report["config"]["weights"] == [0.5, 2.0]
    assert report["config"]["channels"] == ["a", "b"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--weights", "1,1"], "--weights has 2 values .* 3 channels"),
        (["--weights", "1,x,1"], "--weights must be comma-separated numbers"),
        (["--correlation", "1,0.5;0.5"], "--correlation must be a square matrix"),
        (["--correlation", "1,0.5;0.4,1"], "must be symmetric"),
        (["--correlation", "1,0.9,-0.9;0.9,1,0.9;-0.9,0.9,1"], "positive semi-definite"),
        (["--correlation", "1,0;0,1", "--rho", "0.3"], "--rho cannot be combined"),
        (["--correlation", "1,0;0,1", "--channels", "3"], "--channels 3 disagrees"),
        (["--rho", "1.5"], r"rho must be a correlation in \[-1, 1\]"),
        (["--rollouts", "missing.jsonl"], "rollouts file 'missing.jsonl' does not exist"),
        (["--rollouts", "missing.jsonl", "--rho", "0.2"], "--rho applies to synthetic rewards"),
        (["--min-seeds", "3"], "--min-seeds applies to --rollouts only"),
        (["--band", "1.2,0.8"], "--band needs LOW < HIGH"),
        (["--marginals", "binary,cauchy,gaussian"], "unknown reward marginal 'cauchy'"),
        (["--seeds", "1"], "num_seeds must be an integer >= 2"),
    ],
)
def test_bad_input_exits_2_with_a_message(tmp_path: Path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--no-plot", *argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith("mtgrpo analyze: error: ")
    assert re.search(message, error), error
    assert not (tmp_path / "runs").exists()  # nothing written on bad input


def test_command_module_and_analysis_import_light():
    # `mtgrpo --help` imports every command module: torch and matplotlib must wait for run();
    # importing the analysis package must not pull in matplotlib either.
    code = (
        "import sys; import mtgrpo.cli.analyze; "
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules; "
        "import mtgrpo.analysis; assert 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
