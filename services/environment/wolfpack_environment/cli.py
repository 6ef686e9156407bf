"""``wolfpack play`` and ``wolfpack scenarios``: the environment's commands, mounted on the main CLI.

``play`` runs a whole game in process with scripted bots and prints a readable transcript; the same
seed gives byte-identical output (the engines are deterministic and bots draw from a seeded RNG).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from wolfpack_games import GameEnv, get_game, list_games, make_game

if TYPE_CHECKING:
    from wolfpack_environment.stack_play import Stack

console = Console()
err = Console(stderr=True)

ALIASES = {"werewolf": "werewolf_v1"}


def resolve_game(name: str) -> str:
    """``werewolf`` → ``werewolf_v1``, ``bargaining`` → ``bargaining_v1``; full ids pass through. The
    alias is tried first and by ``get_game``: naming one game loads only that game's package."""
    for candidate in dict.fromkeys((ALIASES.get(name, name), name, f"{name}_v1")):
        try:
            get_game(candidate)
        except KeyError:
            continue
        return candidate
    ids = [g.game_id for g in list_games()]
    raise typer.BadParameter(f"unknown game {name!r}; games: {', '.join(sorted(ids))}")


def transcript(env: GameEnv, game_id: str, language: str) -> str:
    if game_id == "werewolf_v1":
        from wolfpack_games.werewolf import render_transcript as werewolf_transcript

        return werewolf_transcript(env, language)  # type: ignore[arg-type]
    from wolfpack_games.scenarios import render_transcript as scenario_transcript

    return scenario_transcript(env)  # type: ignore[arg-type]


def play_game(
    game_id: str,
    variant: str,
    seed: int,
    bots: str,
    language: str = "en",
    options: dict[str, Any] | None = None,
    pace_ms: int = 0,
) -> tuple[GameEnv, dict[str, int]]:
    """Play one game with ``bots`` in every seat (``pace_ms`` after each step); returns the finished
    engine and counters."""
    spec = get_game(game_id)
    if bots not in spec.bots:
        raise typer.BadParameter(f"unknown bots {bots!r} for {game_id}; bots: {', '.join(sorted(spec.bots))}")
    bot = spec.bots[bots]
    env = make_game(game_id, variant)
    reset_options = dict(options or {})
    if game_id == "werewolf_v1":
        reset_options["language"] = language
    env.reset(seed=seed, options=reset_options)
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    while not env.done:
        acting = env.acting_seats()
        result = env.step({seat: bot(env, seat, rng) for seat in acting})
        if pace_ms > 0:
            time.sleep(pace_ms / 1000)
        counts["steps"] += 1
        counts["actions"] += len(acting)
        counts["invalid"] += sum(1 for info in result.infos.values() if info.get("invalid_reason"))
        if counts["steps"] > 100_000:
            raise RuntimeError("game did not finish")
    return env, dict(counts)


def _play_on_stack(
    stack: Stack,
    game_id: str,
    variant: str,
    seed: int,
    bots: str,
    lang: str,
    options: dict[str, Any],
    pace_ms: int,
) -> tuple[GameEnv, dict[str, int], str]:
    """The game through ``stack``'s environment service (``stack_play``): prints where to watch it first,
    fails with one readable line when the service is unreachable or played a different game."""
    import asyncio

    from wolfpack_environment.stack_play import StackPlayError, play_on_stack, stack_transcript, watch_url

    def announce(episode_id: str) -> None:
        where = watch_url(stack.web_url, episode_id) if stack.web_url else "(no web view in this stack)"
        err.print(f"playing on the stack's environment service {stack.environment}: episode {episode_id}")
        err.print(f"watch: {where}", highlight=False, soft_wrap=True)

    try:
        game = asyncio.run(
            play_on_stack(
                stack, game_id, variant, seed, bots, lang, options, pace_ms=pace_ms, on_created=announce
            )
        )
    except StackPlayError as exc:
        err.print(f"{exc} (wolfpack play --local plays in this process)", style="red", markup=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    return (
        game.env,
        game.counts,
        stack_transcript(game, game_id, lang, lambda e: transcript(e, game_id, lang)),
    )


def play(
    game: Annotated[
        str, typer.Argument(help="werewolf, bargaining, allocation, ultimatum, trust, ... or a game id.")
    ],
    seed: Annotated[int, typer.Option(help="Seed: same seed, same game, byte for byte.")] = 0,
    players: Annotated[int | None, typer.Option(help="Werewolf preset: 6, 9 or 12 players.")] = None,
    variant: Annotated[str, typer.Option(help="Variant (e.g. 9p, or easy/medium/hard for scenarios).")] = "",
    bots: Annotated[
        str, typer.Option(help="Scripted bots in every seat: heuristic or random.")
    ] = "heuristic",
    lang: Annotated[
        str, typer.Option("--lang", help="Prompt/transcript language: en or zh (werewolf).")
    ] = "en",
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Game option KEY=YAML_VALUE.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="YAML file of game options (then --option overrides).")
    ] = None,
    local: Annotated[
        bool, typer.Option("--local", help="Play in this process even when `wolfpack up` runs.")
    ] = False,
    pace_ms: Annotated[
        int, typer.Option("--pace-ms", min=0, help="Wait this long after each move (to watch it live).")
    ] = 0,
) -> None:
    """Play a whole game with scripted bots and print a readable transcript and the verified winner.

    When ``wolfpack up`` runs for the run directory (``WOLFPACK_RUN_DIR``, default ``.wolfpack``), the
    game is played through that stack's environment service and the web view's URL of the episode is
    printed first; ``--local`` plays in this process. Either way the same seed gives the same transcript.
    """
    game_id = resolve_game(game)
    if players is not None:
        if game_id != "werewolf_v1":
            raise typer.BadParameter("--players applies to werewolf; use --variant for scenarios")
        variant = f"{players}p"
    spec = get_game(game_id)
    variant = variant or spec.default_variant
    if variant not in spec.variants:
        raise typer.BadParameter(
            f"unknown variant {variant!r} of {game_id}; variants: {', '.join(spec.variants)}"
        )
    options: dict[str, Any] = {}
    if config is not None or option:
        import yaml  # only for options: a plain game needs no YAML parser
    if config is not None:
        try:
            loaded = yaml.safe_load(config.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise typer.BadParameter(f"cannot read --config {config}: {exc}") from None
        if not isinstance(loaded, dict):
            raise typer.BadParameter(f"--config {config} must hold a mapping of options")
        options.update(loaded)
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"--option needs KEY=VALUE, got {item!r}")
        options[key] = yaml.safe_load(value)
    if bots not in spec.bots:
        raise typer.BadParameter(f"unknown bots {bots!r} for {game_id}; bots: {', '.join(sorted(spec.bots))}")
    from wolfpack_environment.stack_play import find_stack  # file reads only: no gRPC until a stack runs

    stack = None if local else find_stack(Path(os.environ.get("WOLFPACK_RUN_DIR") or ".wolfpack"))
    try:
        if stack is None:
            env, counts = play_game(game_id, variant, seed, bots, lang, options, pace_ms=pace_ms)
            text = transcript(env, game_id, lang)
        else:
            env, counts, text = _play_on_stack(stack, game_id, variant, seed, bots, lang, options, pace_ms)
    except (KeyError, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    sys.stdout.write(text)
    outcome = env.outcome()
    winners = sorted(s for s, v in outcome.items() if v > 0)
    sys.stdout.write(
        f"\nSummary: {game_id}/{variant} seed {seed}, bots {bots}: winner {env.winner() or 'none (draw)'}; "
        f"winning seats {', '.join(str(s + 1) for s in winners) or '-'}; "
        f"{counts['steps']} steps, {counts['actions']} actions, {counts['invalid']} invalid.\n"
    )


scenarios_app = typer.Typer(
    help="Generate, list, show and verify verifiable social scenarios.", no_args_is_help=True
)
StoreOpt = Annotated[
    str | None,
    typer.Option(
        help="Scenario store: path, sqlite:///path or redis:// URL. Default: WOLFPACK_SCENARIO_STORE."
    ),
]


def _store_url(store: str | None) -> str:
    from wolfpack.settings import load_settings

    return store or load_settings().scenario_store_url()


@scenarios_app.command("generate")
def scenarios_generate(
    n: Annotated[int, typer.Option(help="How many distinct scenarios.")] = 100,
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 0,
    family: Annotated[list[str] | None, typer.Option(help="Families (repeatable); default all.")] = None,
    difficulty: Annotated[str | None, typer.Option(help="easy, medium or hard; default all.")] = None,
    store: StoreOpt = None,
    llm_base_url: Annotated[
        str | None, typer.Option(help="Optional: paraphrase wording with an OpenAI-compatible endpoint.")
    ] = None,
    llm_model: Annotated[str, typer.Option(help="Model name for --llm-base-url.")] = "",
    llm_api_key_env: Annotated[
        str, typer.Option(help="Environment variable holding the API key.")
    ] = "OPENAI_API_KEY",
) -> None:
    """Generate N distinct, valid, solvable scenarios into the store and summarise them."""
    from rich.progress import track

    from wolfpack_games.scenarios import generate_scenarios, open_store

    try:
        scenarios = generate_scenarios(n, seed, families=family, difficulty=difficulty)
    except (KeyError, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    if llm_base_url:
        import os

        from wolfpack_games.scenarios.variation import openai_chat, vary

        chat = openai_chat(llm_base_url, llm_model, os.environ.get(llm_api_key_env, ""))
        varied = [vary(sc, chat) for sc in track(scenarios, description="LLM variation", console=err)]
        kept = sum(not v.accepted for v in varied)
        scenarios = [v.scenario for v in varied]
        err.print(
            f"LLM variation: {len(varied) - kept} paraphrased, {kept} kept as generated (failed checks)."
        )
    url = _store_url(store)
    if "://" not in url:
        Path(url).parent.mkdir(parents=True, exist_ok=True)
    db = open_store(url)
    new = 0
    for i in track(
        range(0, len(scenarios), 200), description="storing", console=err, disable=not err.is_terminal
    ):
        new += db.insert(scenarios[i : i + 200])
    table = Table(title=f"{len(scenarios)} scenarios (seed {seed}) → {url}")
    for col in ("family", "easy", "medium", "hard", "train", "eval"):
        table.add_column(col)
    by_family: dict[str, Counter[str]] = {}
    for sc in scenarios:
        c = by_family.setdefault(sc.family, Counter())
        c[sc.difficulty] += 1
        c[sc.split or "?"] += 1
    for fam, c in sorted(by_family.items()):
        table.add_row(fam, *(str(c[k]) for k in ("easy", "medium", "hard", "train", "eval")))
    console.print(table)
    distinct = len({sc.id for sc in scenarios})
    console.print(f"{distinct} distinct ids, {new} new in the store, {db.count()} stored in total.")
    db.close()


@scenarios_app.command("list")
def scenarios_list(
    family: Annotated[str | None, typer.Option(help="Filter by family.")] = None,
    split: Annotated[str | None, typer.Option(help="train or eval.")] = None,
    tag: Annotated[str | None, typer.Option(help="Filter by tag.")] = None,
    difficulty: Annotated[str | None, typer.Option(help="easy, medium or hard.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 20,
    store: StoreOpt = None,
) -> None:
    """List stored scenarios."""
    from wolfpack_games.scenarios import open_store

    db = open_store(_store_url(store))
    rows = db.list(family=family, split=split, tag=tag, difficulty=difficulty, limit=limit)
    total = db.count(family=family, split=split, tag=tag, difficulty=difficulty)
    table = Table(title=f"{len(rows)} of {total} scenarios in {_store_url(store)}")
    for col in ("id", "family", "difficulty", "split", "tags"):
        table.add_column(col)
    for sc in rows:
        table.add_row(sc.id, sc.family, sc.difficulty, sc.split, ",".join(sc.tags))
    console.print(table)
    db.close()


@scenarios_app.command("show")
def scenarios_show(scenario_id: str, store: StoreOpt = None) -> None:
    """Print one scenario as JSON."""
    from wolfpack_games.scenarios import open_store

    db = open_store(_store_url(store))
    sc = db.get(scenario_id)
    db.close()
    if sc is None:
        err.print(f"[red]no scenario {scenario_id!r} in {_store_url(store)}[/]")
        raise typer.Exit(1)
    sys.stdout.write(json.dumps(sc.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n")


@scenarios_app.command("verify")
def scenarios_verify(
    scenario_id: str,
    transcript_file: Annotated[Path, typer.Argument(help='JSON lines of {"seat": N, "text": "..."}.')],
    store: StoreOpt = None,
) -> None:
    """Verify a transcript against a stored scenario and print the per-seat outcome."""
    from wolfpack_games.scenarios import open_store, verify_transcript

    db = open_store(_store_url(store))
    sc = db.get(scenario_id)
    db.close()
    if sc is None:
        err.print(f"[red]no scenario {scenario_id!r} in {_store_url(store)}[/]")
        raise typer.Exit(1)
    try:
        lines = [json.loads(ln) for ln in transcript_file.read_text().splitlines() if ln.strip()]
        result = verify_transcript(sc, lines)
    except (OSError, ValueError, KeyError) as exc:
        err.print(f"[red]cannot verify: {exc}[/]")
        raise typer.Exit(2) from None
    console.print(f"Verified outcome: {result.reason}")
    for p in sc.players:
        console.print(f"  seat {p.seat} {p.name} ({p.role}): {result.outcomes[p.seat]:+d}")


def gateway(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (0 picks a free one).")] = 8080,
    env: Annotated[
        str | None, typer.Option(help="Environment service host:port. Default: WOLFPACK_ENVIRONMENT_ADDR.")
    ] = None,
) -> None:
    """Serve the HTTP + WebSocket gateway so non-Python agents can play (protocol: gateway_protocol.md)."""
    import asyncio

    from wolfpack.settings import SettingsError, load_settings
    from wolfpack_environment.gateway import serve_gateway

    try:
        settings = load_settings()
    except SettingsError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    asyncio.run(serve_gateway(host, port, env, settings=settings))


def mount(app: typer.Typer) -> None:
    """Add the environment's commands to the main ``wolfpack`` CLI."""
    app.command("play")(play)
    app.command("gateway")(gateway)
    app.add_typer(scenarios_app, name="scenarios")
