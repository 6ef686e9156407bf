"""Text for humans and models: per-seat observation text and whole-game transcripts.

Why everything is rendered from the event log: an observation is "the rules + the events on the
channels this seat may read, up to the moment it was made", so the only way a hidden fact could reach a
seat is an event on the wrong channel — one place to get right, and one place the leak tests check.
Output is a pure function of the events and the prompt pack, so the same seed gives byte-identical
text. Player numbers are 1-based in all text.

Why prompts are incremental: every LLM turn needs its seat's prompt, and re-formatting the whole
visible log (and the rules) for each one made a late-game prompt cost O(game length) — most of the time
of an LLM-shaped game went there. So each game keeps a :class:`_GameText` beside its event log: every
event's line is formatted at most once (shared by all seats that may read it), each seat's view keeps its
lines and the joined text so far, and the rules, the per-seat header and the "now" section are cached
per configuration. A prompt then costs the new events since that seat's last prompt plus one string
join. The text is the same as a from-scratch render (``libs/tests/games/werewolf/test_render_incremental.py``
compares both over many seeded games).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from wolfpack_games.base import Event, LegalAction
from wolfpack_games.werewolf.models import ALL_ROLES, K_SAVE, MAX_PLAYERS, WerewolfConfig

if TYPE_CHECKING:
    from wolfpack_games.werewolf.engine import WerewolfEnv

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
LANGUAGES: tuple[str, ...] = ("en", "zh")

_CACHE_LIMIT = 4096
"""Entries per memo dict (rules, headers, "now" sections) before it is emptied: they are keyed by
configuration, seat, phase and legal actions, so a long-lived server stays bounded even when re-prompt
feedback texts vary without end."""


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


class _PackCache:
    """What one prompt pack formats again and again, formatted once: player names and memo dicts.

    Holds the pack itself, so the ``id(pack)`` key of ``_PACK_CACHES`` cannot be reused by another
    dict while this entry lives.
    """

    __slots__ = ("heads", "pack", "players", "rules", "tails")

    def __init__(self, pack: dict[str, Any]) -> None:
        self.pack = pack
        template = str(pack["player"])
        self.players: tuple[str, ...] = tuple(template.format(n=i + 1) for i in range(MAX_PLAYERS))
        self.rules: dict[tuple[Any, ...], str] = {}
        self.heads: dict[tuple[Any, ...], str] = {}
        self.tails: dict[tuple[Any, ...], str] = {}


_PACK_CACHES: dict[int, _PackCache] = {}


def _pack_cache(pack: dict[str, Any]) -> _PackCache:
    pc = _PACK_CACHES.get(id(pack))
    if pc is None or pc.pack is not pack:
        if len(_PACK_CACHES) >= 16:  # packs are few (one per language); a caller passing fresh dicts
            _PACK_CACHES.clear()
        pc = _PACK_CACHES[id(pack)] = _PackCache(pack)
    return pc


def _memo_put(memo: dict[Any, str], key: Any, value: str) -> str:
    if len(memo) >= _CACHE_LIMIT:
        memo.clear()
    memo[key] = value
    return value


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


_NONE_KEYED = frozenset({"protect", "vote", "sheriff_vote", "sheriff", "badge", "shoot", "night_victim"})


def _format(kind: str, actor: int, target: int, text: str, day: int, pc: _PackCache) -> str | None:
    """The line of one event given its fields (what :func:`format_event` and the prompt views share)."""
    pack = pc.pack
    key = kind
    if kind in _NONE_KEYED and target < 0:
        key = f"{kind}_none"
    elif kind == "death":
        key = f"death_{text}"
    elif kind == "vote_result" and target < 0:
        key = f"vote_result_{text}"
    elif kind == "game_over" and text == "draw":
        key = "game_over_draw"
    template = pack["events"].get(key)
    if template is None:
        return None
    players = pc.players
    fields: dict[str, Any] = {
        "actor": players[actor] if 0 <= actor < MAX_PLAYERS else _player(pack, actor),
        "target": players[target] if 0 <= target < MAX_PLAYERS else _player(pack, target),
        "text": text,
        "day": day,
    }
    if kind == "setup":
        fields["roles"] = str(pack["players_sep"]).join(
            f"{_player(pack, i)}={_role_name(pack, r)}" for i, r in enumerate(text.split(","))
        )
    elif kind == "game_start":
        fields["roles"] = _roles_summary(pack, text)
        fields["n"] = sum(int(x.partition(":")[2]) for x in text.split(","))
    elif kind in ("role", "reveal", "shoot"):
        fields["role"] = _role_name(pack, text)
    elif kind in ("wolf_team", "revote", "speaking_order"):
        fields["players"] = _players(pack, text)
    elif kind == "inspect":
        fields["result"] = pack["results"].get(text, text)
    elif kind == "game_over":
        fields["winner"] = pack["teams"].get(text, text)
    return str(template).format(**fields)


def format_event(ev: Event, pack: dict[str, Any]) -> str | None:
    """One log line for ``ev`` (None for events that have no line)."""
    return _format(ev.kind, ev.actor, ev.target, ev.text, ev.round, _pack_cache(pack))


def rules_text(config: WerewolfConfig, pack: dict[str, Any]) -> str:
    """The rules section, filled from the config so models read the rules actually in force.

    Computed once per configuration (the fields the text depends on) and pack, then served from a memo.
    """
    roles_list = config.role_list()
    key = (
        config.n_players,
        tuple(roles_list),
        config.win_rule,
        config.witch_self_save,
        config.guard_save_rule,
        config.tie_rule,
        config.sheriff,
        config.sheriff_vote_weight,
    )
    memo = _pack_cache(pack).rules
    text = memo.get(key)
    if text is None:
        text = _memo_put(memo, key, _build_rules(config, roles_list, pack))
    return text


def _build_rules(config: WerewolfConfig, roles_list: list[str], pack: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for r in roles_list:
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


def _tail(
    pc: _PackCache, phase: str, day: int, legal: Sequence[LegalAction], feedback: str, done: bool, n: int
) -> str:
    """The "now" section (phase, legal actions, answer format), memoised per distinct situation."""
    key = (phase, day, tuple(legal), feedback, done, n)
    memo = pc.tails
    text = memo.get(key)
    if text is not None:
        return text
    pack = pc.pack
    lines = [
        "",
        str(pack["now_header"]),
        str(pack["phase_line"]).format(phase=pack["phase_names"].get(phase, phase), day=day),
    ]
    if done:
        lines.append(str(pack["over"]))
    elif legal:
        lines.append(str(pack["phases"].get(phase, "")))
        lines.append(str(pack["legal_header"]))
        lines.extend("- " + _legal_line(pack, la) for la in legal)
        if feedback:
            lines.append(str(pack["feedback"]).format(reason=feedback))
        lines.append(str(pack["answer_format"]).format(n=n))
    else:
        lines.append(str(pack["wait"]))
    return _memo_put(memo, key, "\n".join(lines) + "\n")


class _SeatView:
    """One seat's prompt so far: the lines of the events it may read (each ending in a newline), the
    event index of each line (to cut the view for an observation rendered after later events), how far
    the log was scanned, the joined body of the first ``body_lines`` lines, and the fixed header."""

    __slots__ = ("body", "body_lines", "chans", "head", "idx", "lines", "scanned")

    def __init__(self, chans: frozenset[str], head: str) -> None:
        self.chans = chans
        self.head = head
        self.lines: list[str] = []
        self.idx: list[int] = []
        self.scanned = 0
        self.body = ""
        self.body_lines = 0


_UNSET: Any = object()


class _GameText:
    """The prompt state of one game: the formatted line of each event (``_UNSET`` until a seat that may
    read it needs it; None for events without a line) and one view per seat. Tied to the event log
    list it was built for: a new game (``start``) or a replaced log gives a new list, hence a new state.
    """

    __slots__ = ("lines", "log", "pc", "rules", "views")

    def __init__(self, env: WerewolfEnv) -> None:
        self.log = env._ev
        pack = load_pack(env.config.language)
        self.pc = _pack_cache(pack)
        self.rules = rules_text(env.config, pack)
        self.lines: list[str | None] = []
        self.views: list[_SeatView | None] = [None] * env.n

    def view(self, env: WerewolfEnv, seat: int) -> _SeatView:
        v = self.views[seat]
        if v is None:
            role = env.roles[seat]
            pc = self.pc
            key = (self.rules, seat, role)
            head = pc.heads.get(key)
            if head is None:
                pack = pc.pack
                head = "\n".join(
                    [
                        self.rules,
                        "",
                        str(pack["you_are"]).format(player=_player(pack, seat), role=_role_name(pack, role)),
                        str(pack["role_guidance"][role]),
                        "",
                        str(pack["log_header"]),
                    ]
                )
                head = _memo_put(pc.heads, key, head + "\n")
            v = self.views[seat] = _SeatView(env.visible_channels(seat), head)
        return v

    def advance(self, v: _SeatView, upto: int) -> None:
        """Add the lines of events ``v.scanned .. upto-1`` that ``v``'s seat may read."""
        cache = self.lines
        if len(cache) < upto:
            cache.extend([_UNSET] * (upto - len(cache)))
        log = self.log
        chans = v.chans
        out = v.lines
        idx = v.idx
        pc = self.pc
        for i in range(v.scanned, upto):
            t = log[i]
            if t[2] in chans:
                line = cache[i]
                if line is _UNSET:
                    # (index, kind, channel, actor, target, text, phase, day)
                    line = _format(t[1], t[3], t[4], t[5], t[7], pc)
                    cache[i] = line = None if line is None else line + "\n"
                if line is not None:
                    out.append(line)
                    idx.append(i)
        v.scanned = upto


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
    """The text seat ``seat`` sees: rules, its role, visible events up to ``n_events``, instructions.

    Grows the seat's view by the events since its last prompt (see the module docstring); an
    observation rendered after later events (``n_events`` behind the view) is cut to its own events.
    """
    gt = env._prompts
    if gt is None or gt.log is not env._ev:
        gt = env._prompts = _GameText(env)
    v = gt.view(env, seat)
    if v.scanned < n_events:
        gt.advance(v, n_events)
    k = len(v.lines) if n_events >= v.scanned else bisect_left(v.idx, n_events)
    done_lines = v.body_lines
    if k == done_lines:
        body = v.body
    elif k > done_lines:
        body = v.body = v.body + "".join(v.lines[done_lines:k])
        v.body_lines = k
    else:  # an older observation read late: cut, and keep the view's body for the newer prompts
        body = "".join(v.lines[:k])
    return "".join((v.head, body, _tail(gt.pc, phase, day, legal, feedback, done, env.n)))


def render_events(events: Iterable[Event], language: str = "en", include_private: bool = True) -> list[str]:
    """Transcript lines of ``events`` (omniscient when ``include_private``; else the public record)."""
    pack = load_pack(language)
    pc = _pack_cache(pack)
    out: list[str] = []
    for ev in events:
        ch = ev.channel
        if ch != "public" and not include_private:
            continue
        if ch == "system" and ev.kind != "setup":
            continue
        line = _format(ev.kind, ev.actor, ev.target, ev.text, ev.round, pc)
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
