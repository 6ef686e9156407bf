"""What the trainer refuses from the trajectory stream before an update sees it.

Why: the stream is shared (any producer with the Redis URL can append), and one entry that breaks an
update used to end the run — a token id outside the model's vocabulary (``IndexError`` in the embedding),
fewer logprobs than tokens (``ValueError`` in ``batch.py``) — and every resume after it, since the entry
is delivered again. Worse, a non-finite logprob or reward does not fail at all: it turns the loss, then
every weight, into NaN. ``unusable`` names such an entry; the loop dead-letters it (``<stream>:dead``,
with the reason, atomically with its ack), logs it and trains on the rest. It checks only what the update
reads: the turns of the policies this job trains (an opponent served by another model may use other ids)
and the seats' final rewards.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from wolfpack.v1 import trajectory_pb2


def vocab_size(model_path: str, tokenizer: Any) -> int:
    """Token ids the policy's embedding accepts: the model config's ``vocab_size`` (the table may be larger
    than the tokenizer), else the tokenizer's length when the config does not say."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(text.vocab_size)
    except Exception:  # no readable config (a GGUF-only directory): the tokenizer bounds it
        return len(tokenizer)


def _ids_outside(ids: Any, vocab: int) -> bool:
    """Any id below 0, or at or past ``vocab`` when it is known (> 0: a trainer that was not set up)."""
    return bool(ids) and (min(ids) < 0 or 0 < vocab <= max(ids))


def unusable(traj: trajectory_pb2.Trajectory, policies: Collection[str], vocab: int) -> str:
    """Why ``traj`` would break an update of ``policies`` (an empty string when it would not)."""
    if not traj.trajectory_id:
        return "no trajectory_id"
    for o in traj.outcomes:
        if not math.isfinite(o.final_reward):
            return f"seat {o.seat}: final_reward is {o.final_reward}"
    for t in traj.turns:
        if t.policy.policy_id not in policies:
            continue
        where = f"turn {t.index} (seat {t.seat}, policy {t.policy.policy_id!r})"
        if not math.isfinite(t.reward):
            return f"{where}: reward is {t.reward}"
        if len(t.response_logprobs) != len(t.response_token_ids):
            return f"{where}: {len(t.response_logprobs)} logprobs for {len(t.response_token_ids)} tokens"
        if not all(math.isfinite(x) for x in t.response_logprobs):
            return f"{where}: a logprob is not finite"
        if _ids_outside(t.prompt_token_ids, vocab) or _ids_outside(t.response_token_ids, vocab):
            return f"{where}: a token id is outside the model's vocabulary [0, {vocab or 'unknown'})"
    return ""
