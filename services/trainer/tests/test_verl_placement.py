"""Which card a one-process ``verl_fsdp`` learner trains on (``device: cuda:N``), so a 2-GPU host can keep vLLM
on the first card and the learner on the second; under torchrun each rank keeps its own card."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl (trainer extra) is not installed")

from wolfpack_trainer.learners.verl.learner import cuda_index


@pytest.mark.parametrize(
    ("device", "env", "want"),
    [
        ("cuda", {}, 0),
        ("cuda:1", {}, 1),
        (
            "cuda:1",
            {"LOCAL_RANK": "0", "WORLD_SIZE": "1"},
            1,
        ),  # our own one-process defaults do not override it
        ("cuda", {"LOCAL_RANK": "0", "WORLD_SIZE": "1"}, 0),
        ("cuda:1", {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}, 0),  # torchrun: each rank on its LOCAL_RANK card
        ("cuda", {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, 1),
    ],
)
def test_cuda_index(device: str, env: dict[str, str], want: int) -> None:
    assert cuda_index(device, env) == want
