"""Text for humans and models: per-seat observation text and whole-game transcripts.

Why everything is rendered from the event log: an observation is "the rules + the events on the
channels this seat may read, up to the moment it was made", so the only way a hidden fact could reach a
seat is an event on the wrong channel — one place to get right, and one place the leak tests check.
Output is a pure function of the events and the prompt pack, so the same seed gives byte-identical
text. Player numbers are 1-based in all text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from wolfpack_games.base import Event, LegalAction
from wolfpack_games.werewolf.models import ALL_ROLES, K_SAVE, WerewolfConfig

if TYPE_CHECKING:
    from wolfpack_games.werewolf.engine import WerewolfEnv

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
LANGUAGES: tuple[str, ...] = ("en", "zh")


@lru_cache(maxsize=8)
def load_pack(language: str = "en") -> dict[str, Any]:
    """The prompt pack for ``language`` (``prompts/<language>.yaml``), loaded once and cached."""
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; languages: {', '.join(LANGUAGES)}")
    with open(PROMPT_DIR / f"{language}.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict):  # pragma: no cover - a broken pack file
        raise ValueError(f"prompt pack {language} is not a mapping")
    return data


def _player(pack: dict[str, Any], seat: int) -> str:
    if seat < 0:
        return str(pack["nobody"])
    return str(pack["player"]).format(n=seat + 1)


def _players(pack: dict[str, Any], csv: str) -> str:
    seats = [int(x) for x in csv.split(",") if x != ""]
    return str(pack["players_sep"]).join(_player(pack, s) for s in seats) or str(pack["nobody"])


def _role_name(pack: dict[str, Any], role: str) -> str:
    return str(pack["roles"].get(role, role))


def _roles_summary(pack: dict[str, Any], csv: str) -> str:
    """``werewolf:2,villager:2`` -> ``2 Werewolf, 2 Villager``."""
    parts = []
    for item in csv.split(","):
        role, _, count = item.partition(":")
        parts.append(str(pack["role_count"]).format(count=count, role=_role_name(pack, role)))
    return str(pack["players_sep"]).join(parts)


def format_event(ev: Event, pack: dict[str, Any]) -> str | None:
    """One log line for ``ev`` (None for events that have no line)."""
    t = pack["events"]
    kind = ev.kind
    key = kind
    if (
        kind in ("protect", "vote", "sheriff_vote", "sheriff", "badge", "shoot", "night_victim")
        and ev.target < 0
    ):
        key = f"{kind}_none"
    elif kind == "death":
        key = f"death_{ev.text}"
    elif kind == "vote_result" and ev.target < 0:
        key = f"vote_result_{ev.text}"
    elif kind == "game_over" and ev.text == "draw":
        key = "game_over_draw"
    template = t.get(key)
    if template is None:
        return None
    fields: dict[str, Any] = {
        "actor": _player(pack, ev.actor),
        "target": _player(pack, ev.target),
        "text": ev.text,
        "day": ev.round,
    }
    if kind == "setup":
        fields["roles"] = str(pack["players_sep"]).join(
            f"{_player(pack, i)}={_role_name(pack, r)}" for i, r in enumerate(ev.text.split(","))
        )
    elif kind == "game_start":
        fields["roles"] = _roles_summary(pack, ev.text)
        fields["n"] = sum(int(x.partition(":")[2]) for x in ev.text.split(","))
    elif kind in ("role", "reveal", "shoot"):
        fields["role"] = _role_name(pack, ev.text)
    elif kind in ("wolf_team", "revote", "speaking_order"):
        fields["players"] = _players(pack, ev.text)
    elif kind == "inspect":
        fields["result"] = pack["results"].get(ev.text, ev.text)
    elif kind == "game_over":
        fields["winner"] = pack["teams"].get(ev.text, ev.text)
    return str(template).format(**fields)


def rules_text(config: WerewolfConfig, pack: dict[str, Any]) -> str:
    """The rules section, filled from the config so models read the rules actually in force."""
    counts: dict[str, int] = {}
    for r in config.role_list():
        counts[r] = counts.get(r, 0) + 1
    roles = str(pack["players_sep"]).join(
        str(pack["role_count"]).format(count=counts[r], role=_role_name(pack, r))
        for r in ALL_ROLES
        if r in counts
    )
    extra = pack["extra_rules"]
    parts = [extra[f"witch_{config.witch_self_save}"]]
    if "guard" in counts:
        parts.append(extra[f"guard_{config.guard_save_rule}"])
    parts.append(extra[f"tie_{config.tie_rule}"])
    if config.sheriff:
        parts.append(str(extra["sheriff"]).format(weight=config.sheriff_vote_weight))
    return (
        str(pack["rules"])
        .format(
            n=config.n_players,
            roles=roles,
            win_rule=pack["win_rules"][config.win_rule],
            extra_rules=str(pack["rules_join"]).join(parts),
        )
        .rstrip()
    )


def _legal_line(pack: dict[str, Any], la: LegalAction) -> str:
    template = str(pack["actions"].get(la.kind, la.kind))
    if la.kind == K_SAVE:
        return template.format(target=_player(pack, la.targets[0] if la.targets else -1))
    if la.targets:
        nums = str(pack["players_sep"]).join(str(t + 1) for t in la.targets)
        return template + str(pack["targets"]).format(players=nums)
    return template


def render_observation(
    env: WerewolfEnv,
    seat: int,
    n_events: int,
    phase: str,
    day: int,
    legal: Sequence[LegalAction],
    feedback: str,
    done: bool,
) -> str:
    """The text seat ``seat`` sees: rules, its role, visible events up to ``n_events``, instructions."""
    pack = load_pack(env.config.language)
    role = env.roles[seat]
    lines = [
        rules_text(env.config, pack),
        "",
        str(pack["you_are"]).format(player=_player(pack, seat), role=_role_name(pack, role)),
        str(pack["role_guidance"][role]),
        "",
        str(pack["log_header"]),
    ]
    chans = env.visible_channels(seat)
    events = env.events
    for i in range(n_events):
        ev = events[i]
        if ev.channel in chans:
            line = format_event(ev, pack)
            if line is not None:
                lines.append(line)
    lines.append("")
    lines.append(str(pack["now_header"]))
    lines.append(str(pack["phase_line"]).format(phase=pack["phase_names"].get(phase, phase), day=day))
    if done:
        lines.append(str(pack["over"]))
    elif legal:
        lines.append(str(pack["phases"].get(phase, "")))
        lines.append(str(pack["legal_header"]))
        lines.extend("- " + _legal_line(pack, la) for la in legal)
        if feedback:
            lines.append(str(pack["feedback"]).format(reason=feedback))
        lines.append(str(pack["answer_format"]).format(n=env.n))
    else:
        lines.append(str(pack["wait"]))
    return "\n".join(lines) + "\n"


def render_events(events: Iterable[Event], language: str = "en", include_private: bool = True) -> list[str]:
    """Transcript lines of ``events`` (omniscient when ``include_private``; else the public record)."""
    pack = load_pack(language)
    out: list[str] = []
    for ev in events:
        ch = ev.channel
        if ch != "public" and not include_private:
            continue
        if ch == "system" and ev.kind != "setup":
            continue
        line = format_event(ev, pack)
        if line is None:
            continue
        if ch.startswith("seat:"):
            line = str(pack["private_prefix"]).format(player=_player(pack, int(ch[5:]))) + line
        out.append(line)
    return out


def render_transcript(env: WerewolfEnv, language: str | None = None, include_private: bool = True) -> str:
    """A readable transcript of a finished or running game (phases, speeches, votes, deaths, winner).

    ``language`` defaults to the game's configured language. The text is a pure function of the
    events, so the same seed and actions give a byte-identical transcript.
    """
    lang = language or env.config.language
    pack = load_pack(lang)
    title = str(pack["transcript_title"]).format(n=env.n, seed=env.seed)
    body = render_events(env.events, lang, include_private)
    return "\n".join([title, "=" * 40, *body]) + "\n"
