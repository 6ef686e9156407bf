"""A Werewolf game played by sotopia agents through ``WolfpackSotopiaEnv``.

By default every seat is a scripted sotopia agent (our heuristic bot), so this runs offline in well
under a second. ``--model`` with ``--base-url`` seats sotopia's own ``LLMAgent`` (through litellm) on any
OpenAI-compatible endpoint (vLLM, SGLang, our inference service, OpenAI) in the ``--llm-seats`` seats::

    .venv/bin/python examples/sotopia_werewolf.py --variant 9p --seed 3
    .venv/bin/python examples/sotopia_werewolf.py --model Qwen/Qwen3-8B \\
        --base-url http://localhost:8000/v1 --llm-seats 1,4

The API key is read from ``CUSTOM_API_KEY`` (sotopia's convention for ``custom/`` models; "EMPTY" if unset).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from wolfpack_environment.sotopia_compat import (
    ScriptedSotopiaAgent,
    SotopiaAgent,
    WolfpackSotopiaEnv,
    run_episode,
)
from wolfpack_games.werewolf import WerewolfEnv, render_transcript


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="6p", choices=["6p", "9p", "12p"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bot", default="heuristic", choices=["heuristic", "random"])
    parser.add_argument("--language", default="en", choices=["en", "zh"])
    parser.add_argument("--model", help="model name served at --base-url; seats sotopia LLMAgents")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    parser.add_argument("--llm-seats", default="1", help="comma-separated player numbers for the LLM")
    parser.add_argument("--quiet", action="store_true", help="print only the outcome, not the transcript")
    return parser.parse_args()


async def main(args: argparse.Namespace) -> None:
    env = WolfpackSotopiaEnv("werewolf_v1", args.variant, game_options={"language": args.language})
    names = env.default_agent_names(seed=args.seed)  # "Player 1".."Player N"
    agents: list[SotopiaAgent] = [
        ScriptedSotopiaAgent(env, name, bot=args.bot, seed=args.seed * 100 + i)
        for i, name in enumerate(names)
    ]
    if args.model:
        if not args.base_url:
            raise SystemExit("--model needs --base-url (an OpenAI-compatible endpoint)")
        from sotopia.agents import LLMAgent  # after sotopia_compat: it picks the storage backend

        # sotopia routes "custom/<model>@<base_url>" to litellm's OpenAI client at that URL.
        model_name = f"custom/{args.model}@{args.base_url}"
        for number in (int(n) for n in args.llm_seats.split(",") if n.strip()):
            agents[number - 1] = LLMAgent(agent_name=names[number - 1], model_name=model_name)
    result = await run_episode(env, agents, seed=args.seed)
    if not args.quiet and isinstance(env.game, WerewolfEnv):
        print(render_transcript(env.game, args.language))
    summary: dict[str, Any] = {
        "winner": result.winner or "draw",
        "turns": result.turns,
        "outcome": result.outcome,
        "penalties": {k: v for k, v in result.penalties.items() if v},
    }
    print(summary)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
