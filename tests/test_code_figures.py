"""scripts/code_figures.py: the comment and line counts on hand-made sources, and the reward
path's table in docs/architecture.md naming files and functions that exist."""

from __future__ import annotations

import re

from script_loader import ROOT, load_script

figures = load_script("scripts/code_figures.py")


def test_comment_density_counts_comment_tokens_once_per_line(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        'x = 1  # trailing\n'
        's = "# in a string, not a comment"\n'
        '\n'
        '# alone  # twice on one line\n'
        '"""\n'
        '# inside a docstring\n'
        '"""\n')
    assert figures.comment_density(source) == (6, 2)
    (tmp_path / "more.py").write_text("# one\n\n\ny = 2\n")
    assert figures.comment_density(tmp_path) == (8, 3)  # a folder: every .py file under it


def test_docstring_lines_count_only_when_asked(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        '"""A module\n'
        'docstring."""\n'
        "\n"
        "def f():\n"
        '    """One line."""\n'
        "    x = 1  # a comment\n"
        '    """Not a docstring: a later string."""\n'
        "    return x\n")
    assert figures.comment_density(source) == (7, 1)
    assert figures.comment_density(source, docstrings=True) == (7, 4)  # lines 1, 2, 5 and 6


def test_function_lines_leaves_out_the_docstring_comments_and_blanks(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "def other():\n"
        "    pass\n"
        "\n"
        "class A:\n"
        "    def step(self):\n"
        '        """Two\n'
        '        lines."""\n'
        "        # a comment\n"
        "\n"
        "        a = 1  # code with a comment\n"
        "        return a\n")
    assert figures.function_lines(source, "step") == (7, 3)  # def, a = 1, return


def test_the_reward_path_table_names_files_and_functions_that_exist():
    handoffs, files = figures.reward_path(ROOT / "docs" / "architecture.md")
    assert handoffs >= 5
    assert len(files) == len(set(files)) >= 3
    section = (ROOT / "docs" / "architecture.md").read_text().split(
        "## A reward's path to the loss", 1)[1].split("\n## ", 1)[0]
    for row in (r for r in section.splitlines() if re.match(r"\| \d+ \|", r)):
        where, handoff = row.split("|")[2].strip().strip("`"), row.split("|")[3]
        source = (ROOT / "src" / "mtgrpo" / where).read_text()
        named = re.search(r"`([A-Za-z_][\w.]*)", handoff)
        if named:  # the hand-off's first name is defined in its row's file
            name = named.group(1).split(".")[-1]
            assert re.search(rf"\b(def|class) {name}\b", source), (where, name)


def test_the_table_prints_every_figure(capsys):
    assert figures.main([]) == 0
    out = capsys.readouterr().out
    for figure in ("options in", "`training_step`", "hand-offs in", "README.md",
                   "comment lines, `algo/`"):
        assert figure in out
