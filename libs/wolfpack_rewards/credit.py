"""Credit assignment: how a seat's outcome value is spread over that seat's turns.

* ``terminal``: all of it on the seat's last turn (the classic sparse episodic reward);
* ``uniform``: every turn gets the full value (each decision is credited with the result; note that the
  seat's final reward, being the sum of its turn rewards, is then ``n_turns * value``);
* ``discounted``: turn ``k`` of ``n`` gets ``value * gamma ** (n - 1 - k)``, so the last turn gets the
  full value and earlier decisions geometrically less.
"""

from __future__ import annotations

from collections.abc import Sequence

from wolfpack_rewards.config import CreditMode


def assign(positions: Sequence[int], value: float, mode: CreditMode, gamma: float = 1.0) -> dict[int, float]:
    """``{position: credit}`` for one seat whose turns are at ``positions`` (in trajectory order)."""
    if not positions:
        return {}
    if mode == "terminal":
        return {positions[-1]: value}
    if mode == "uniform":
        return dict.fromkeys(positions, value)
    n = len(positions)
    return {p: value * gamma ** (n - 1 - k) for k, p in enumerate(positions)}
