"""The command line as one voice: `train` without a CONFIG, both spellings of every option,
help for every option with its default, help text without reStructuredText marks."""

from __future__ import annotations

import argparse

import pytest
import yaml

from mtgrpo.cli import COMMANDS, build_parser, main, normalize_argv, plain_text


def _print_config(argv, capsys) -> dict:
    assert main(argv) == 0
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("argv", [
    ["train", "--print-config", "--max_steps", "10"],
    ["train", "--max_steps", "10", "--print-config"],
    ["train", "--max-steps", "10", "--print-config"],
    ["train", "--print_config", "--max-steps=10"],
    ["--debug", "train", "--print-config", "--max_steps", "10"],
    ["train", "quickstart", "--print-config", "--max-steps", "10"],
])
def test_train_without_a_config_is_the_quickstart_and_fields_take_both_spellings(argv, capsys):
    config = _print_config(argv, capsys)
    assert config["max_steps"] == 10
    assert config["output_dir"] == "runs/quickstart"


def test_a_sections_field_takes_both_spellings(capsys):
    config = _print_config(["train", "--print-config", "--sft.max-steps", "7"], capsys)
    assert config["sft"]["max_steps"] == 7


def test_other_commands_take_both_spellings():
    assert normalize_argv(["eval", "--num_samples", "2", "--max_new_tokens=8"]) == \
        ["eval", "--num-samples", "2", "--max-new-tokens=8"]
    parsed = build_parser().parse_args(normalize_argv(
        ["sft", "--model", "m", "--output", "o", "--tasks", "t", "--max_steps", "3",
         "--num_examples", "4"]))
    assert (parsed.max_steps, parsed.num_examples) == (3, 4)


def test_train_help_lists_the_sections_and_the_most_used_fields(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "[CONFIG] [--field value ...]" in out
    assert "sections: model, data, tasks, rewards, peft, sft" in out
    assert "--print-config" in out
    for field in ("--max_steps", "--learning_rate", "--num_generations", "--task_weighting"):
        assert f"  {field}  " in out
    assert "(default: quickstart)" in out
    assert "--max-steps" not in out.replace("--max-steps works", "")  # one spelling shown


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            yield action


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_has_help_that_shows_its_default(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command_parser = sub.choices[command]
    text = command_parser.format_help()
    assert "``" not in text
    assert ":func:" not in text
    for action in _options(command_parser):
        assert action.help, f"mtgrpo {command} {action.option_strings[0]} has no help"
        formatter = command_parser._get_formatter()
        shown = formatter._expand_help(action) if action.help else ""
        if action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in shown.lower(), (command, action.option_strings, shown)


def test_eval_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 8)" in out  # --num-samples
    assert "(default: 1.0)" in out  # --temperature
    assert "(default: runs/eval)" in out  # --out


def test_plain_text_drops_restructuredtext_marks():
    assert plain_text("run ``quickstart`` (:func:`~mtgrpo.sft.sft_train`)") == \
        "run quickstart (mtgrpo.sft.sft_train)"


def test_sft_on_an_earlier_runs_directory_names_the_flags_to_type(tmp_path, capsys):
    out = tmp_path / "warm"
    (out / "model").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("")
    argv = ["sft", "--model", "m", "--data", str(tmp_path / "pairs.jsonl"), "--output", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--output {out} already holds an SFT run (metrics.jsonl, model)" in err
    assert "add --overwrite-output-dir to replace it" in err
    assert "overwrite_output_dir=True" not in err
    assert main([*argv, "--overwrite_output_dir"]) == 2  # past that check: the data file
    assert "is not a file" in capsys.readouterr().err
