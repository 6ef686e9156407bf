"""Random ``TrainBatch``es in verl's layout, for learner tests and benchmarks that need no model or game.

Why here, beside the learners: six tests and benches built the same padded batch by hand (masks from lengths,
random token ids, positions, empty rewards), each a copy with small variations. The token ids and the drawn
fields come from the caller's generator in a fixed order (prompts, responses, then ``draw``), so a batch is
reproducible from its seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from wolfpack_trainer.learners.base import TrainBatch

DRAWN = ("advantages", "returns")
"""Fields ``random_batch`` can fill: standard normal values on the response tokens, zero on padding."""


def random_batch(
    plen: torch.Tensor,
    rlen: torch.Tensor,
    widths: tuple[int, int],
    vocab: int,
    g: torch.Generator,
    *,
    uids: Sequence[str] | None = None,
    trajectory_ids: Sequence[str] | None = None,
    policy: str = "p",
    role: str = "r",
    turn: int = -1,
    draw: Sequence[str] = (),
) -> TrainBatch:
    """``len(plen)`` rows: prompts of ``plen`` tokens left-padded to ``widths[0]``, responses of ``rlen``
    right-padded to ``widths[1]``, token ids in ``[3, vocab)`` from ``g``; ``uids`` and ``trajectory_ids``
    default to the row numbers; ``draw`` names fields of ``DRAWN`` filled from ``g`` in that order."""
    n = len(plen)
    p_width, r_width = widths
    pmask = (torch.arange(p_width)[None, :] >= (p_width - plen)[:, None]).long()
    rmask = (torch.arange(r_width)[None, :] < rlen[:, None]).long()
    prompts = torch.randint(3, vocab, (n, p_width), generator=g) * pmask
    responses = torch.randint(3, vocab, (n, r_width), generator=g) * rmask
    attention = torch.cat([pmask, rmask], dim=1)
    mask = rmask.float()
    rows = [str(i) for i in range(n)]
    batch = TrainBatch(
        prompts=prompts, responses=responses, input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0) * attention,
        response_mask=mask, rollout_log_probs=torch.zeros(n, r_width), token_level_rewards=torch.zeros(n, r_width),
        uids=list(uids or rows), trajectory_ids=list(trajectory_ids or rows), policy_ids=[policy] * n,
        roles=[role] * n, policy_versions=[0] * n, turn_indices=[turn] * n,
    )  # fmt: skip
    for name in draw:
        if name not in DRAWN:
            raise ValueError(f"random_batch draws {', '.join(DRAWN)}, not {name!r}")
        setattr(batch, name, torch.randn(n, r_width, generator=g) * mask)
    return batch
