"""``benchmarks/eval_loss_cost.py`` end to end on the tiny model: the same evaluation with and
without the loss's forward pass gives the same samples and the same ``eval_loss``."""

from __future__ import annotations

import math

from script_loader import load_script

bench = load_script("benchmarks/eval_loss_cost.py")


def test_the_evaluation_without_the_forward_reports_the_same_loss(tiny_model_dir, tmp_path,
                                                                  capsys) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(
        f"model: {{name_or_path: {tiny_model_dir}}}\n"
        "tasks:\n"
        "  tasks: [{family: basic_arithmetic, name: add,\n"
        "           config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}]\n"
        "  train_size: 8\n  eval_size: 6\n  seed: 0\n"
        "num_generations: 2\nprompts_per_step: 2\n"
        "max_prompt_length: 128\nmax_completion_length: 6\n"
        "rewards: [{name: length_reward, target_length: 4}]\n"
        "num_generations_eval: 3\nbf16: false\n")
    result = bench.main(["--config", str(run), "--model", str(tiny_model_dir), "--threads", "1",
                         "--repeats", "8"])
    pairs = result["pairs"]
    assert [p["seed"] for p in pairs] == list(range(8))
    for pair in pairs:  # the same completions on both routes, so exactly the same loss
        assert pair["same_accuracy"]
        assert pair["eval_loss_with_forward"] == pair["eval_loss_without"]
        assert math.isfinite(pair["eval_loss_without"])
    # The loss is -sum_i A_i |o_i| / sum_i |o_i|: 0 when a group's completions are equally long
    # (the advantages sum to 0), not 0 when the tiny model stops some early (half the seeds)
    assert any(pair["eval_loss_without"] != 0 for pair in pairs)
    assert result["seconds_with_forward"] > 0
    assert result["seconds_without"] > 0
    assert "without" in capsys.readouterr().out
