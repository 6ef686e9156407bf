"""An OpenAI-compatible chat model plays Werewolf on the Wolfpack environment service.

Any endpoint that speaks ``/v1/chat/completions`` works: OpenAI, vLLM, llama.cpp, Ollama, LM Studio.
The agent sends the seat's observation text (rules, role, visible history, instruction and, on a
re-prompt, why the last answer was rejected) as the user message and the model's reply verbatim as
``raw_text``: the game's own forgiving parser turns it into an action, exactly as during RL training,
so this example measures the model and not a hand-written prompt adapter.

Start a service, then play (a new episode with scripted bots in the other seats):

    wolfpack serve environment --address 127.0.0.1:50051 &
    OPENAI_API_KEY=sk-... python examples/openai_agent.py --env 127.0.0.1:50051 --model gpt-4o-mini

    # a local model, no key:
    python examples/openai_agent.py --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct

    # join a seat of an existing episode (id and seat token from CreateEpisode):
    python examples/openai_agent.py --episode EPISODE_ID --token SEAT_TOKEN --model ...

Why it never crashes on the model: API errors are retried with backoff, then (like an empty or
over-long reply) replaced by a safe legal fallback; an unparseable reply is the game's business (it
re-prompts with feedback, then applies a default action). The summary counts each of these.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass

import grpc
from openai import AsyncOpenAI

from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient, SeatSession

SYSTEM_PROMPT = (
    "You are a strong player of social deduction games. Read the game state and answer in the format "
    "the instructions ask for: for an action, only the action (for example 'vote 3' or 'pass'); for a "
    "speech, only what you say, in at most three sentences."
)
OUTCOMES = {
    common_pb2.OUTCOME_KIND_WIN: "WIN",
    common_pb2.OUTCOME_KIND_LOSS: "LOSS",
    common_pb2.OUTCOME_KIND_DRAW: "DRAW",
    common_pb2.OUTCOME_KIND_ABORTED: "ABORTED",
}


@dataclass
class Stats:
    decisions: int = 0
    model_calls: int = 0
    model_errors: int = 0
    fallbacks: int = 0
    invalid: int = 0
    defaulted: int = 0


def fallback_text(obs: pb.Observation) -> str:
    """A reply that is always legal: a short speech, else pass, else the first legal move."""
    if any(la.needs_text for la in obs.legal_actions):
        return "I have nothing to add for now."
    kinds = [la.kind for la in obs.legal_actions]
    if "pass" in kinds or not obs.legal_actions:
        return "pass"
    la = obs.legal_actions[0]
    return f"{la.kind} {la.targets[0] + 1}" if la.targets else la.kind  # texts use 1-based player numbers


class ModelPlayer:
    def __init__(self, args: argparse.Namespace, api_key: str, stats: Stats) -> None:
        # Our own retry loop (below) knows about fallbacks; the SDK's would only add hidden latency.
        self.client = AsyncOpenAI(
            base_url=args.base_url, api_key=api_key, max_retries=0, timeout=args.timeout
        )
        self.args = args
        self.stats = stats

    def messages(self, obs: pb.Observation) -> list[dict[str, str]]:
        text = obs.text
        if obs.feedback and obs.feedback not in text:  # games that do not render feedback themselves
            text += f"\n\nYour previous answer was rejected: {obs.feedback}\nAnswer again."
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]

    async def reply(self, obs: pb.Observation) -> str:
        for attempt in range(self.args.retries + 1):
            self.stats.model_calls += 1
            try:
                completion = await self.client.chat.completions.create(
                    model=self.args.model,
                    messages=self.messages(obs),  # type: ignore[arg-type]
                    temperature=self.args.temperature,
                    max_tokens=self.args.max_tokens,
                )
                content = completion.choices[0].message.content if completion.choices else None
                if content and content.strip():
                    return content[: self.args.max_reply_chars]
                raise ValueError("empty reply")
            except Exception as exc:  # any endpoint failure (HTTP, timeout, bad JSON) is retried, never fatal
                self.stats.model_errors += 1
                print(f"  model error ({attempt + 1}/{self.args.retries + 1}): {exc}", file=sys.stderr)
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
        self.stats.fallbacks += 1
        return fallback_text(obs)


async def play(seat: SeatSession, player: ModelPlayer, stats: Stats, quiet: bool) -> pb.Observation:
    """Like ``SeatSession.play``, plus counts of re-prompts and defaults for the summary."""
    last: pb.Observation | None = None
    async for obs in seat.observe():
        last = obs
        while obs.your_turn and not obs.done:
            stats.decisions += 1
            text = await player.reply(obs)
            try:
                resp = await seat.act(obs.turn_id, text)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    break  # the turn moved on (we were too slow: default applied); wait for the next one
                if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                stats.invalid += 1  # e.g. over the service's text limit: send the safe fallback instead
                resp = await seat.act(obs.turn_id, fallback_text(obs))
            stats.invalid += not resp.accepted and not resp.duplicate
            stats.defaulted += resp.defaulted and not resp.duplicate
            if not quiet:
                verdict = (
                    "ok" if resp.accepted else "DEFAULTED" if resp.defaulted else f"rejected: {resp.reason}"
                )
                shown = " ".join(text.split())[:70]
                print(f"[{obs.phase} {obs.round}] {shown!r} -> {verdict}", flush=True)
            obs = last = resp.observation
            if resp.accepted or resp.defaulted:
                break
    assert last is not None
    return last if last.done else await seat.observation()


async def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    target = args.env or settings.service_addr("environment")
    api_key = os.environ.get(args.api_key_env, "")
    if not api_key:
        print(f"note: ${args.api_key_env} is not set; sending a placeholder key", file=sys.stderr)
    stats = Stats()
    player = ModelPlayer(args, api_key or "not-needed", stats)
    async with EnvironmentClient(target, settings) as env:
        if args.episode:
            if not args.token:
                print("--episode needs --token (the seat token)", file=sys.stderr)
                return 2
            episode_id, token = args.episode, args.token
        else:
            created = await env.create_episode(
                "werewolf_v1",
                args.variant,
                args.seed,
                external_seats=(args.seat,),
                default_bot=args.bots,
                language=args.language,
                turn_timeout_s=args.turn_timeout,
            )
            episode_id, token = created.episode_id, created.seat_tokens[args.seat]
            print(f"created episode {episode_id} (werewolf_v1/{args.variant}, seed {args.seed})", flush=True)
        seat = env.seat(episode_id, token)
        first = await seat.observation()
        print(f"playing as Player {first.seat + 1} (seat {first.seat}), role {first.role}", flush=True)
        final = await play(seat, player, stats, args.quiet)
        state = await env.get_episode(episode_id, token)
    outcome = OUTCOMES.get(final.outcome, "UNKNOWN")
    print(
        f"Summary: episode {episode_id} | Player {final.seat + 1} ({final.role or first.role}) | "
        f"outcome {outcome} | winner {state.winner or '-'} | replies {stats.decisions} | "
        f"invalid replies {stats.invalid} | defaulted {stats.defaulted} | model calls {stats.model_calls} | "
        f"model errors {stats.model_errors} | fallbacks {stats.fallbacks}",
        flush=True,
    )
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Play Werewolf on the Wolfpack environment service with an OpenAI-compatible model."
    )
    p.add_argument(
        "--env", help="environment service host:port (default: WOLFPACK_ENVIRONMENT_ADDR or the stack's)"
    )
    p.add_argument(
        "--base-url", default=None, help="OpenAI-compatible base URL (default: the SDK's, api.openai.com)"
    )
    p.add_argument("--model", default="gpt-4o-mini", help="model name sent to the endpoint")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--episode", help="join this existing episode (needs --token) instead of creating one")
    p.add_argument("--token", help="seat token for --episode")
    p.add_argument(
        "--variant", default="6p", choices=["6p", "9p", "12p"], help="Werewolf preset for a new episode"
    )
    p.add_argument("--seed", type=int, default=0, help="episode seed (same seed, same roles)")
    p.add_argument("--seat", type=int, default=0, help="0-based seat this agent takes in a new episode")
    p.add_argument("--bots", default="heuristic", help="scripted bot for the other seats (heuristic, random)")
    p.add_argument("--language", default="en", choices=["en", "zh"], help="prompt language")
    p.add_argument(
        "--turn-timeout", type=float, default=0.0, help="seconds per decision before a default (0: server)"
    )
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=512, help="reply length limit sent to the model")
    p.add_argument(
        "--max-reply-chars", type=int, default=4000, help="replies are cut to this many characters"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per model call")
    p.add_argument("--retries", type=int, default=2, help="retries per decision after a model error")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except grpc.aio.AioRpcError as exc:
        print(f"environment service error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
