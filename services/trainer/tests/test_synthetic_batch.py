"""``random_batch``: verl's layout (left-padded prompts, right-padded responses, positions counting real
tokens only) from lengths, and nothing drawn but what is asked for."""

from __future__ import annotations

import pytest
import torch

from wolfpack_trainer.learners.synthetic import random_batch


def test_layout_follows_the_lengths() -> None:
    g = torch.Generator().manual_seed(0)
    b = random_batch(torch.tensor([2, 4]), torch.tensor([3, 1]), (4, 3), 50, g, draw=("advantages",))
    assert b.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]]
    assert b.position_ids.tolist() == [[0, 0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 0]]
    assert bool((b.input_ids[b.attention_mask == 0] == 0).all()) and bool(
        (b.input_ids[b.attention_mask == 1] >= 3).all()
    )
    assert b.advantages is not None and b.returns is None
    assert b.advantages[1, 1:].tolist() == [0.0, 0.0] and b.uids == ["0", "1"]
    with pytest.raises(ValueError, match="not 'values'"):
        random_batch(torch.tensor([1]), torch.tensor([1]), (1, 1), 50, g, draw=("values",))
