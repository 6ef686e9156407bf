"""The environment's session layer without gRPC: the server's CPU per action for the PlaySeats state
machine, split from the engine work it drives.

Why: ``bench_env_cpu.py`` measures server + client over gRPC, where load and the transport blur which
Python code costs what. Here one process plays the server's part exactly as a PlaySeats call does
(``PlayStream.handle`` then ``decisions`` on the bytes a client would send, the response serialised as
gRPC would), with the client's part (parse the response, answer every decision with a random legal move
as text, serialise the acts) done in the same loop but timed apart. The engine column is the same
games' engine work alone (``observe`` with the prompt rendered, ``parse`` + ``step_seat``): what any
host must spend, so ``server - engine`` is the session layer's own cost.

    .venv/bin/python bench/env/bench_session_layer.py                    # 6, 9, 12 players
    .venv/bin/python bench/env/bench_session_layer.py --players 9 --profile /tmp/layer.prof

An older revision's session layer: put its ``libs`` and ``services/environment`` first on ``PYTHONPATH``
(``bench_env_grpc.checkout``); before ``PlaySeatsRequest.omit_messages`` existed only the prompt-twice
column is measured ("n/a" in the others), before ``prompt_delta`` no delta column.

Modes: *twice* (``text`` and ``messages``), *once* (``omit_messages``), *delta* (``omit_messages`` and
``prompt_delta``: what ``EnvironmentClient.play_stream`` asks for; the client part rebuilds the prompts).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import episode_request
from wolfpack_environment.convert import EpisodeFactory, Observations
from wolfpack_environment.play_stream import PlayStream
from wolfpack_environment.sessions import EpisodeManager, Limits
from wolfpack_games.werewolf import WerewolfEnv

SECTIONS = ("parse", "handle", "decisions", "serialize")
"""The server part's sections: parse the request; apply it (``PlayStream.handle``: creates, acts);
the decisions that became due (``PlayStream.decisions``, prompts rendered); serialise the response."""

HAS_ONCE = "omit_messages" in pb.PlaySeatsRequest.DESCRIPTOR.fields_by_name
"""Whether this tree's protos have the prompt-once flag (an older revision on PYTHONPATH may not)."""
HAS_DELTA = "prompt_delta" in pb.PlaySeatsRequest.DESCRIPTOR.fields_by_name
"""Whether they have ``prompt_delta``."""
HAS_OMIT_FINAL = "omit_final_text" in pb.PlaySeatsRequest.DESCRIPTOR.fields_by_name
"""Whether they have ``omit_final_text``."""
MODES = ("twice", *(("once",) if HAS_ONCE else ()), *(("delta",) if HAS_DELTA else ()))


def answer(obs: pb.Observation, rng: random.Random) -> str:
    la = rng.choice(obs.legal_actions)
    if la.needs_text:
        return "I have nothing to add."
    return f"{la.kind} {rng.choice(la.targets) + 1}" if la.targets else la.kind


async def session_layer(
    players: int,
    episodes: int,
    seconds: float,
    seed: int,
    mode: str,
    prof: cProfile.Profile | None,
    final_text: bool = True,
    games: int = 0,
    observations: Observations | None = None,
) -> tuple[int, float, float, dict[str, float]]:
    """(actions, server CPU s, client CPU s, server CPU µs/action by section): ``episodes`` in flight on
    one PlayStream for ``seconds``. ``final_text=False``: final observations without their prompt
    (``omit_final_text``, what ``bench_env_cpu.py``'s main row asks for; ignored by a tree without it).
    ``games``: play exactly this many episodes instead (``seconds`` ignored): the same seeded games, so the
    same work, whatever the machine's load (``--games``, for instruction counts under valgrind).
    ``observations``: the legal-action encoding cache to use (a server's lives as long as the process);
    a fresh one by default."""
    manager = EpisodeManager(Limits(acts_per_second=1e9, burst=10**9))
    stream = PlayStream(manager, EpisodeFactory(manager), observations or Observations())
    rng = random.Random(seed)
    clock = time.process_time
    server = client = 0.0
    actions = 0
    next_seed = seed
    tokens: dict[tuple[str, int], str] = {}
    live: dict[str, int] = {}  # episode id -> seats not finished yet
    deadline = time.perf_counter() + seconds
    sections = dict.fromkeys(SECTIONS, 0.0)

    sent_seeds: deque[int] = deque()  # seeds of the creates not answered yet, in order
    game_seed: dict[str, int] = {}  # episode id -> its seed (``games``: answers drawn per decision)

    def creates(n: int) -> list[pb.CreateEpisodeRequest]:
        nonlocal next_seed
        out = []
        if games:
            n = min(n, seed + games - next_seed)
        for _ in range(n):
            out.append(episode_request("werewolf_v1", f"{players}p", seed=next_seed,
                                       external_seats=tuple(range(players))))  # fmt: skip
            sent_seeds.append(next_seed)
            next_seed += 1
        return out

    first = pb.PlaySeatsRequest(
        create=creates(episodes), include_text=True, close_finished=True, rejected_results_only=True
    )
    if not final_text and HAS_OMIT_FINAL:
        first.omit_final_text = True
    restore: Callable[[Any], None] | None = None
    if mode == "once":
        first.omit_messages = True
        from wolfpack_environment.client import restore_messages as restore
    elif mode == "delta":
        first.omit_messages = first.prompt_delta = True
        from wolfpack_environment.client import restore_prompts

        prompts: dict[tuple[str, int], str] = {}

        def restore(decisions: Any) -> None:
            restore_prompts(decisions, prompts, True)

    wire = first.SerializeToString()
    while True:
        # server: parse the client's message, apply it, send the decisions that became due
        t0 = clock()
        if prof is not None:
            prof.enable()
        req = pb.PlaySeatsRequest.FromString(wire)
        ta = clock()
        results: list[pb.SeatActResult] = []
        created: list[pb.CreatedEpisode] = []
        await stream.handle(req, results, created)
        tb = clock()
        response = pb.PlaySeatsResponse(results=results, created=created)
        stream.decisions(response.decisions)
        tc = clock()
        out = response.SerializeToString()
        if prof is not None:
            prof.disable()
        t1 = clock()
        server += t1 - t0
        sections["parse"] += ta - t0
        sections["handle"] += tb - ta
        sections["decisions"] += tc - tb
        sections["serialize"] += t1 - tc
        # client: what EnvironmentClient's PlayStream + play_episodes do with it
        msg = pb.PlaySeatsResponse.FromString(out)
        if restore is not None:
            restore(msg.decisions)
        nxt = pb.PlaySeatsRequest()
        for c in msg.created:
            game_seed[c.episode.episode_id] = sent_seeds.popleft()  # answers come in request order
            live[c.episode.episode_id] = len(c.episode.seat_tokens)
            for t in c.episode.seat_tokens:
                tokens[(c.episode.episode_id, t.seat)] = t.token
        ended = 0
        for obs in msg.decisions:
            if obs.done:
                live[obs.episode_id] -= 1
                if not live[obs.episode_id]:
                    del live[obs.episode_id]
                    ended += 1
            elif obs.your_turn and obs.turn_id:
                nxt.acts.add(episode_id=obs.episode_id, token=tokens[(obs.episode_id, obs.seat)],
                             turn_id=obs.turn_id, raw_text=answer(obs, rng if not games else random.Random(
                                 f"{game_seed[obs.episode_id]} {obs.seat} {obs.turn_id}")))  # fmt: skip
                actions += 1
        if ended and (games or time.perf_counter() < deadline):
            nxt.create.extend(creates(ended))
        wire = nxt.SerializeToString()
        client += clock() - t1
        if not nxt.acts and not nxt.create:
            if not live:
                break
            raise RuntimeError("no decision for a live episode")
    return actions, server, client, {k: v / actions * 1e6 for k, v in sections.items()}


def play_engine_game(env: WerewolfEnv, rng: random.Random) -> int:
    """Play a started game to its end doing the engine work the service does per action: the acting seat's
    prompt rendered (``observe``), a random legal answer written as text, parsed and stepped; the actions."""
    actions = 0
    while not env.done:
        for s in env.acting_seats():
            o = env.observe(s)
            _ = o.text  # rendered lazily: the service renders every decision's prompt
            la = rng.choice(o.legal_actions)
            text = ("I have nothing to add." if la.needs_text
                    else f"{la.kind} {rng.choice(la.targets) + 1}" if la.targets else la.kind)  # fmt: skip
            parsed = env.parse(s, text).action
            env.step_seat(s, parsed if parsed is not None else text)
            actions += 1
    return actions


def engine_only(players: int, seconds: float, seed: int) -> tuple[int, float]:
    """(actions, CPU s) of the engine work the service does per action (``play_engine_game``); no session
    layer."""
    rng = random.Random(seed)
    env = WerewolfEnv(f"{players}p")
    actions = 0
    t0 = time.process_time()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        env.reset(seed=seed)
        seed += 1
        actions += play_engine_game(env, rng)
    return actions, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--players", type=int, nargs="+", default=[6, 9, 12], choices=[6, 9, 12])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--episodes", type=int, default=32, help="episodes in flight on the stream")
    ap.add_argument("--profile", default="", help="cProfile the server part (last mode) into this file")
    ap.add_argument("--games", type=int, default=0, help="play exactly this many games per cell (fixed work)")
    args = ap.parse_args()
    # The collector as a server runs it (``wolfpack.rpc.tune_gc``): start-up frozen, the youngest generation
    # collected every 50,000 allocations. With the default 700 the collector costs this process ~15 % more
    # server CPU than the service pays (6 alternating rounds, 9 players, 32 in flight).
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    prof = cProfile.Profile() if args.profile else None
    names = " / ".join(MODES)
    print(f"| players | engine µs/action | server µs/action, prompt {names} | server - engine, {names} "
          f"| client µs/action, {names} |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")

    def f(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{x:.1f}"

    by_section: dict[int, dict[str, float]] = {}
    for players in args.players:
        cells: dict[str, list[float]] = {}
        for r in range(args.rounds):
            n, cpu = engine_only(players, args.seconds, 1000 * r)
            cells.setdefault("engine", []).append(cpu / n * 1e6)
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                n, s, c, parts = asyncio.run(
                    session_layer(
                        players, args.episodes, args.seconds, 1000 * r, mode, None, games=args.games
                    )
                )
                for name, value in parts.items():
                    cells.setdefault(f"{name} {mode}", []).append(value)
                cells.setdefault(f"server {mode}", []).append(s / n * 1e6)
                cells.setdefault(f"client {mode}", []).append(c / n * 1e6)
        med = {k: statistics.median(v) for k, v in cells.items()}
        e = med["engine"]
        server = " / ".join(f(med[f"server {m}"]) for m in MODES)
        layer = " / ".join(f(med[f"server {m}"] - e) for m in MODES)
        client = " / ".join(f(med[f"client {m}"]) for m in MODES)
        print(f"| {players} | {f(e)} | {server} | {layer} | {client} |")
        by_section[players] = med
    print(f"\nserver µs/action by section, medians ({' / '.join(MODES)})\n")
    print("| players | " + " | ".join(SECTIONS) + " |")
    print("| --- |" + " --- |" * len(SECTIONS))
    for players, med in by_section.items():
        row = [" / ".join(f(med[f"{name} {m}"]) for m in MODES) for name in SECTIONS]
        print(f"| {players} | " + " | ".join(row) + " |")
    if prof is not None:  # a run of its own: the profiler's overhead stays out of the table
        asyncio.run(session_layer(args.players[0], args.episodes, args.seconds, 0, MODES[-1], prof))
        prof.dump_stats(args.profile)


if __name__ == "__main__":
    main()
