"""Text for humans and models: per-seat observation text and whole-game transcripts.

Why everything is rendered from the event log: an observation is "the rules + the events on the
channels this seat may read, up to the moment it was made", so the only way a hidden fact could reach a
seat is an event on the wrong channel — one place to get right, and one place the leak tests check.
Output is a pure function of the events and the prompt pack, so the same seed gives byte-identical
text. Player numbers are 1-based in all text.

Why prompts are incremental: every LLM turn needs its seat's prompt, and re-formatting the whole
visible log (and the rules) for each one made a late-game prompt cost O(game length) — most of the time
of an LLM-shaped game went there. So each game keeps a :class:`_GameText` beside its event log: every
event's line is formatted at most once and filed under its channel, and each seat's joined text grows by
the new lines of the channels it may read (a from-scratch merge only for an observation read after the
seat's view moved past it). Rules, per-seat headers, "now" sections and the lines of structural events
(votes, deaths, phase headers) are memoised across games; speeches are formatted once per game. A prompt
then costs the events since that seat's last prompt plus one join. The text is byte-identical to a
from-scratch render (``libs/tests/games/werewolf/test_render_incremental.py`` compares both over seeded
games). The memos assume a prompt pack is not edited in place after ``load_pack`` returned it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from functools import lru_cache
from operator import attrgetter
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


_FREE_TEXT = frozenset({"speech", "last_words", "wolf_speech", "invalid"})
"""Event kinds whose text is free (speeches, re-prompt reasons): formatted each time, never memoised
(every model speech is new; memoising them would only grow the memo)."""


class _PackCache:
    """What one prompt pack formats again and again, formatted once: player names and memo dicts.

    Holds the pack itself, so the ``id(pack)`` key of ``_PACK_CACHES`` cannot be reused by another
    dict while this entry lives.
    """

    __slots__ = ("config_rules", "free", "heads", "lines", "pack", "players", "rules", "tails")

    def __init__(self, pack: dict[str, Any]) -> None:
        self.pack = pack
        template = str(pack["player"])
        self.players: tuple[str, ...] = tuple(template.format(n=i + 1) for i in range(MAX_PLAYERS))
        self.rules: dict[tuple[Any, ...], str] = {}
        self.heads: dict[tuple[Any, ...], str] = {}
        self.tails: dict[tuple[Any, ...], str] = {}
        self.lines: dict[tuple[Any, ...], str | None] = {}
        self.config_rules: dict[int, tuple[WerewolfConfig, str]] = {}
        events = pack["events"]
        self.free: dict[str, str] = {k: str(events[k]) for k in _FREE_TEXT if events.get(k) is not None}


_PACK_CACHES: dict[int, _PackCache] = {}
_UNSET: Any = object()


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


_LEGAL_FIELDS = attrgetter("kind", "targets", "needs_text")


def _tail(
    pc: _PackCache, phase: str, day: int, legal: Sequence[LegalAction], feedback: str, done: bool, n: int
) -> str:
    """The "now" section (phase, legal actions, answer format), memoised per distinct situation."""
    # The legal actions by their fields: hashing the ``LegalAction`` dataclasses themselves (a Python
    # ``__hash__`` each) cost more than the rest of a prompt.
    key = (phase, day, feedback, done, n, *map(_LEGAL_FIELDS, legal))
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


class _Channel:
    """The lines of one channel so far (each ending in a newline) and the event index of each."""

    __slots__ = ("idx", "lines")

    def __init__(self) -> None:
        self.idx: list[int] = []
        self.lines: list[str] = []


class _GameText:
    """The prompt state of one game: every event's line, formatted once, filed under its channel (only
    channels some seat may read), and per seat (parallel lists, cheaper to set up per game than one
    object a seat) its fixed header, the channels it may read, how many lines of each are already in its
    joined ``bodies`` text, and the event count ``pos`` that text covers. Tied to the event log list it
    was built for: a new game (``start``) or a replaced log gives a new list, hence a new state."""

    __slots__ = (
        "bodies",
        "channels",
        "heads",
        "log",
        "pc",
        "pos",
        "rules",
        "scanned",
        "tails",
        "taken",
        "vchans",
    )

    def __init__(self, env: WerewolfEnv) -> None:
        self.log = env._ev
        cfg = env.config
        pack = load_pack(cfg.language)
        pc = self.pc = _pack_cache(pack)
        # The rules by config object first (engines share one preset object across games, and treat
        # their config as read-only), then by the fields the text depends on (``rules_text``).
        hit = pc.config_rules.get(id(cfg))
        if hit is not None and hit[0] is cfg:
            rules = hit[1]
        else:
            rules = rules_text(cfg, pack)
            if len(pc.config_rules) >= _CACHE_LIMIT:
                pc.config_rules.clear()
            pc.config_rules[id(cfg)] = (cfg, rules)
        self.rules = rules
        self.scanned = 0
        # (id(legal), phase, day, feedback, done) -> (legal, the "now" section): the engine hands the
        # same legal tuple to every seat of a speech phase or a sheriff ballot, and this game holds the
        # tuple, so its id stays its own.
        self.tails: dict[tuple[Any, ...], tuple[Sequence[LegalAction], str]] = {}
        channels: dict[str, _Channel] = {}
        self.channels = channels
        n = env.n
        memo = pc.heads
        roles = env.roles
        heads: list[str] = []
        vchans: list[list[_Channel]] = []
        taken: list[list[int]] = []
        for seat in range(n):
            role = roles[seat]
            key = (rules, seat, role)
            head = memo.get(key)
            if head is None:
                head = _memo_put(memo, key, self._head(seat, role))
            heads.append(head)
            chans = []
            for ch in env.visible_channels(seat):
                c = channels.get(ch)
                if c is None:
                    c = channels[ch] = _Channel()
                chans.append(c)
            vchans.append(chans)
            taken.append([0] * len(chans))
        self.heads = heads
        self.vchans = vchans
        self.taken = taken
        self.bodies = [""] * n
        self.pos = [0] * n

    def _head(self, seat: int, role: str) -> str:
        pack = self.pc.pack
        lines = [
            self.rules,
            "",
            str(pack["you_are"]).format(player=_player(pack, seat), role=_role_name(pack, role)),
            str(pack["role_guidance"][role]),
            "",
            str(pack["log_header"]),
        ]
        return "\n".join(lines) + "\n"

    def scan(self, upto: int) -> None:
        """File the lines of events ``scanned .. upto-1`` under their channels.

        Lines of structural events ("Player 3 votes to exile Player 5.", "=== Night 2 ===") repeat
        across games and come from a memo; free-text events (speeches, re-prompt reasons) are formatted
        each time and never memoised (every model speech is new).
        """
        log = self.log
        channels = self.channels
        pc = self.pc
        memo = pc.lines
        free = pc.free
        players = pc.players
        pack = pc.pack
        for i in range(self.scanned, upto):
            # (index, kind, channel, actor, target, text, phase, day)
            t = log[i]
            c = channels.get(t[2])
            if c is None:
                continue
            kind = t[1]
            if kind in _FREE_TEXT:  # what _format gives for these kinds, without its generic steps
                template = free.get(kind)
                if template is None:
                    line = None
                else:
                    a, b = t[3], t[4]
                    line = (
                        template.format(
                            actor=players[a] if 0 <= a < MAX_PLAYERS else _player(pack, a),
                            target=players[b] if 0 <= b < MAX_PLAYERS else _player(pack, b),
                            text=t[5],
                            day=t[7],
                        )
                        + "\n"
                    )
            else:
                key = t[1:]  # all but the index: (kind, channel, actor, target, text, phase, day)
                line = memo.get(key, _UNSET)
                if line is _UNSET:
                    line = _format(kind, t[3], t[4], t[5], t[7], pc)
                    if line is not None:
                        line += "\n"
                    if len(memo) >= _CACHE_LIMIT * 4:
                        memo.clear()
                    memo[key] = line
            if line is not None:
                c.idx.append(i)
                c.lines.append(line)
        self.scanned = upto

    def body(self, seat: int, upto: int) -> str:
        """The joined lines of ``seat``'s channels for events before ``upto`` (``upto <= scanned``).

        Plain loops on purpose: this runs once per prompt, and each comprehension, generator or lambda
        costs a frame of its own.
        """
        pos = self.pos[seat]
        if upto == pos:
            return self.bodies[seat]
        chans = self.vchans[seat]
        if upto < pos:  # an older observation read late: merge from scratch, keep the view as is
            spans = []
            for c in chans:
                spans.append((c, 0, bisect_left(c.idx, upto)))
            return _merge(spans)
        full = upto >= self.scanned
        taken = self.taken[seat]
        first: tuple[_Channel, int, int] | None = None
        more: list[tuple[_Channel, int, int]] | None = None
        for j, c in enumerate(chans):
            s = taken[j]
            e = len(c.idx) if full else bisect_left(c.idx, upto, s)
            if e > s:
                taken[j] = e
                if first is None:
                    first = (c, s, e)
                elif more is None:
                    more = [first, (c, s, e)]
                else:
                    more.append((c, s, e))
        self.pos[seat] = upto
        text = self.bodies[seat]
        if more is not None:
            if len(more) == 2:  # e.g. a private line and public ones: mostly one run after the other
                (c, s, e), (c2, s2, e2) = more
                if c.idx[e - 1] < c2.idx[s2]:
                    text += "".join(c.lines[s:e] + c2.lines[s2:e2])
                elif c2.idx[e2 - 1] < c.idx[s]:
                    text += "".join(c2.lines[s2:e2] + c.lines[s:e])
                else:
                    text += _merge(more)
            else:
                text += _merge(more)
        elif first is not None:  # the usual case: one channel (mostly public) has new lines
            c, s, e = first
            text += "".join(c.lines[s:e])
        self.bodies[seat] = text
        return text


def _first_index(span: tuple[_Channel, int, int]) -> int:
    return span[0].idx[span[1]]


def _merge(spans: list[tuple[_Channel, int, int]]) -> str:
    """The lines ``lines[s:e]`` of several channels joined in event order.

    Usually the spans do not interleave (a private line before or after a run of public ones), so they
    are joined whole in order of their first event; only interleaved spans are merged line by line.
    """
    live = []
    for span in spans:
        if span[2] > span[1]:
            live.append(span)
    live.sort(key=_first_index)
    pieces = []
    last = -1
    for c, s, e in live:
        if c.idx[s] < last:
            break
        last = c.idx[e - 1]
        pieces.append("".join(c.lines[s:e]))
    else:
        return "".join(pieces)
    pairs: list[tuple[int, str]] = []
    for c, s, e in live:
        pairs.extend(zip(c.idx[s:e], c.lines[s:e], strict=True))
    pairs.sort()
    return "".join([line for _, line in pairs])


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
    if gt.scanned < n_events:
        gt.scan(n_events)
    key = (id(legal), phase, day, feedback, done)
    hit = gt.tails.get(key)
    if hit is not None and hit[0] is legal:
        tail = hit[1]
    else:
        tail = _tail(gt.pc, phase, day, legal, feedback, done, env.n)
        gt.tails[key] = (legal, tail)
    body = gt.bodies[seat] if gt.pos[seat] == n_events else gt.body(seat, n_events)
    return "".join((gt.heads[seat], body, tail))


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
