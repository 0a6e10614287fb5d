"""A few rows of the MT-GRPO papers' released test sets, in their layout (verl's), written to
parquet files for tests that must run without the released files.

The texts are the released rows' own (countdown-easy index 0, zebra-easy index 0, arc-easy
index 0, copied from /work/shared/data/mtgrpo-paper-test), plus one more countdown-easy
problem in the same wording. They are spelled out here, not built with the library's
templates, so that a test comparing the library's prompts with them can fail.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# The released files themselves, where this machine has them (tests on them skip elsewhere).
PAPER_DIR = Path("/work/shared/data/mtgrpo-paper-test")
needs_paper_data = pytest.mark.skipif(
    not PAPER_DIR.is_dir(), reason="the papers' released test sets are not on this machine"
)

PREAMBLE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer.\nUser: "
)
CLOSING = "\nAssistant: Let me solve this step by step."


def countdown_question(numbers: list[int], target: int) -> str:
    """The papers' countdown sentence, as the released prompts write it."""
    return (
        f"Using the numbers [{', '.join(map(str, numbers))}], create an equation that equals "
        f"{target}. You can only use basic arithmetic operations (+, -, *, /) and each number "
        "should be used exactly once. Return the final answer in \\boxed{}, for example "
        "\\boxed{(1 + 2) / 3}."
    )


ZEBRA_QUESTION = (
    "This is a logic puzzle. There are 3 houses (numbered 1 on the left, 3 on the right), from "
    "the perspective of someone standing across the street from them. Each has a different "
    "person in them. They have different characteristics:\n"
    " - Each person has a unique name: bob, arnold, alice\n"
    " - They all have a different favorite flower: daffodils, carnations, iris\n"
    " - Each mother is accompanied by their child: billy, alice, timothy\n\n"
    "1. Alice is the person's child is named Alice.\n"
    "2. The person who loves a bouquet of daffodils is in the third house.\n"
    "3. The person who loves a carnations arrangement is Arnold.\n"
    "4. The person who loves the boquet of iris is the person's child is named Alice.\n"
    "5. The person who is the mother of Billy is in the second house.\n\n"
    "What is Name of the person who lives in House 1? Provide only the name of the person as "
    "your final answer and put in in \\boxed{}, for example: \\boxed{Alice}."
)
ARC_QUESTION = (
    "Find the common rule that maps an input grid to an output grid, given the examples "
    "below.\n\n"
    "Example 1:\nInput:  0 8 8 8 8 8 8 8 0 1\nOutput: 0 0 8 8 8 8 8 8 8 1\n\n"
    "Example 2:\nInput:  0 0 0 1 3 3 3 3 3 0\nOutput: 0 0 0 1 3 3 3 3 3 0\n\n"
    "Example 3:\nInput:  7 7 7 7 7 7 7 1 0 0\nOutput: 7 7 7 7 7 7 7 1 0 0\n\n"
    "Below is a test input grid. Predict the corresponding output grid by applying the rule you "
    "found. Describe how you derived the rule and your overall reasoning process in detail "
    "before you submit your answer. Your final answer must be placed in \\boxed{} and should be "
    "just the test output grid itself.\n\nInput:\n9 9 9 0 0 0 0 1 0 0"
)
ARC_ANSWER = "0 0 0 0 9 9 9 1 0 0"
# The first countdown problem asked in the family's wording for <answer> tags.
TAG_COUNTDOWN = (
    "Using the numbers [8, 73, 96], create an equation that equals 841. You can only use basic "
    "arithmetic operations (+, -, *, /) and each number should be used exactly once. Return the "
    "final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)
COUNTDOWN_PROBLEMS = (([8, 73, 96], 841), ([3, 5, 7], 22))


def _row(data_source: str, question: str, truth: dict, index: int, extra_question: str) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"content": PREAMBLE + question + CLOSING, "role": "user"}],
        "ability": "math",
        "reward_model": {"ground_truth": truth, "style": "rule"},
        "extra_info": {"difficulty": 1, "index": index, "question": extra_question,
                       "split": "test"},
    }


def write_release(directory: Path) -> Path:
    """``test_countdown.parquet`` (2 countdown-easy rows), ``test_zebra.parquet`` and
    ``test_arc.parquet`` (1 easy row each) under ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    countdown = [
        _row("countdown-easy-test", countdown_question(numbers, target),
             {"numbers": ",".join(map(str, numbers)), "target": target}, index,
             # the release's extra_info holds reasoning-gym's own wording, unused for countdown
             f"Using the numbers {', '.join(map(str, numbers))}, create an expression.")
        for index, (numbers, target) in enumerate(COUNTDOWN_PROBLEMS)
    ]
    zebra = [_row("zebra-easy-test", ZEBRA_QUESTION, {"target": "alice"}, 0, ZEBRA_QUESTION)]
    arc = [_row("arc-easy-test", ARC_QUESTION, {"target": ARC_ANSWER}, 0, ARC_QUESTION)]
    for name, rows in (("countdown", countdown), ("zebra", zebra), ("arc", arc)):
        pq.write_table(pa.Table.from_pylist(rows), directory / f"test_{name}.parquet")
    return directory
