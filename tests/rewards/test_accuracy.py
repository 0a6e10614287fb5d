import math

import pytest
import torch

from mtgrpo.rewards.accuracy import accuracy_channel_index, correct_completions

NAN = math.nan


def test_first_applicable_channel_decides():
    values = torch.tensor([
        [1.0, NAN],   # channel 0 applies: correct
        [NAN, 0.1],   # channel 1 applies: 0.1 < 1, wrong
        [0.1, 5.0],   # channel 0 applies first: wrong even though channel 1 is high
        [NAN, NAN],   # nothing applies: not correct
        [NAN, 1.0],   # channel 1: correct
    ])
    assert correct_completions(values).tolist() == [True, False, False, False, True]


def test_named_channel_and_threshold():
    values = torch.tensor([[0.1, 0.6], [1.0, 0.4], [1.0, NAN]])
    assert correct_completions(values, 0.5, channel=1).tolist() == [True, False, False]
    assert accuracy_channel_index(["a", "b"], "b") == 1
    assert accuracy_channel_index(["a", "b"], None) is None
    with pytest.raises(ValueError, match="accuracy_reward='c' is not a reward channel"):
        accuracy_channel_index(["a", "b"], "c")
