"""``wolfpack league``: the opponent league of a running curriculum service as a table a person can read
(rating, games, record against the trainee, PFSP share), and ``--register`` to add a frozen checkpoint
(a write: it needs ``WOLFPACK_ADMIN_SECRET`` where the service has one; an id already registered with
another policy is refused)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()


async def _league(addr: str, register: str, policy: str, version: int, bot: str) -> int:
    import grpc  # here, not at the top: every ``wolfpack`` command imports this module to mount it

    from wolfpack.settings import load_settings
    from wolfpack.v1 import curriculum_service_pb2 as pb
    from wolfpack_curriculum.client import CurriculumClient
    from wolfpack_curriculum.league import Entry, LeagueConfig, pfsp_weights

    async with CurriculumClient(addr, load_settings()) as cur:
        try:
            if register:
                opp = pb.Opponent(opponent_id=register)
                if bot:
                    opp.kind, opp.bot = pb.OPPONENT_KIND_SCRIPTED, bot
                else:
                    opp.kind = pb.OPPONENT_KIND_CHECKPOINT
                    opp.policy.policy_id, opp.policy.version = policy or register, version
                resp = await cur.register_opponent(opp)
                console.print(
                    f"{'registered' if resp.created else 'already registered'} {register} "
                    f"(rating {resp.opponent.rating:.0f})"
                )
            table = await cur.list_opponents()
        except grpc.aio.AioRpcError as exc:
            console.print(f"[red]curriculum at {addr}: {exc.code().name}: {exc.details()}[/]")
            return 1
    trainee = Entry("trainee", table.trainee_rating)
    entries = [Entry(o.opponent_id, o.rating) for o in table.opponents]
    weights = pfsp_weights(trainee, entries, LeagueConfig())
    total = sum(weights) or 1.0
    out = Table(title=f"League (trainee rating {table.trainee_rating:.0f} after {table.trainee_games} games)")
    for col in ("opponent", "kind", "policy", "rating", "games", "W-L-D (vs trainee)", "PFSP share"):
        out.add_column(
            col,
            justify="right" if col in ("rating", "games", "PFSP share") else "left",
            no_wrap=col == "opponent",
        )
    for o, w in zip(table.opponents, weights, strict=True):
        policy_txt = f"{o.policy.policy_id}@{o.policy.version}" if o.policy.policy_id else o.bot
        out.add_row(
            o.opponent_id, pb.OpponentKind.Name(o.kind).removeprefix("OPPONENT_KIND_").lower(), policy_txt,
            f"{o.rating:.0f}", str(o.games), f"{o.wins}-{o.losses}-{o.draws}", f"{w / total:.0%}",
        )  # fmt: skip
    Console(width=max(console.width, 110)).print(out)  # pipes default to 80 columns: keep ids whole
    return 0


def league(
    address: Annotated[str | None, typer.Option(help="Curriculum host:port (default from settings).")] = None,
    register: Annotated[str, typer.Option(help="Register this opponent id before listing.")] = "",
    policy: Annotated[str, typer.Option(help="Inference policy id of the registered checkpoint.")] = "",
    version: Annotated[int, typer.Option(help="Policy version of the registered checkpoint.")] = 0,
    bot: Annotated[str, typer.Option(help="Register a scripted bot instead of a checkpoint.")] = "",
) -> None:
    """Show the opponent league (ratings, games, PFSP sampling shares); optionally register an opponent."""
    from wolfpack.cli.main import settings_or_exit

    addr = address or settings_or_exit().service_addr("curriculum")
    import asyncio

    raise typer.Exit(asyncio.run(_league(addr, register, policy, version, bot)))


def mount(app: typer.Typer) -> None:
    """Add the curriculum's commands to the main ``wolfpack`` CLI."""
    app.command("league")(league)
