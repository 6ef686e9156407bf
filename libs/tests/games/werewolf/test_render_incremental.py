"""The incremental prompt renderer gives byte-for-byte the text of a from-scratch render.

Why a reference copy: ``render.py`` keeps one view per seat that grows as events arrive (each event's
line formatted once, rules and headers memoised). Its promise is that nothing about the text changed, so
the oracle here is the renderer as it was before (``_ref_render``: every visible event re-formatted from
the templates, the rules rebuilt per call), kept only in this test. Games are seeded and varied (EN and
ZH, 6/9/12 players, rule options that add events: revotes, sheriff, wolf king, guard), actions arrive as
structured actions, valid text and garbage text (re-prompt feedback), and observations are read both at
once and late, in shuffled order, after the game moved on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from wolfpack_games.base import Action, Event, LegalAction, Observation
from wolfpack_games.werewolf import WerewolfEnv, heuristic_bot, random_bot
from wolfpack_games.werewolf import render as render_mod
from wolfpack_games.werewolf.models import ALL_ROLES, K_SAVE, WerewolfConfig
from wolfpack_games.werewolf.render import load_pack

# --- the renderer before incremental prompts (reference only; do not use elsewhere) ------------------


def _ref_player(pack: dict[str, Any], seat: int) -> str:
    if seat < 0:
        return str(pack["nobody"])
    return str(pack["player"]).format(n=seat + 1)


def _ref_players(pack: dict[str, Any], csv: str) -> str:
    seats = [int(x) for x in csv.split(",") if x != ""]
    return str(pack["players_sep"]).join(_ref_player(pack, s) for s in seats) or str(pack["nobody"])


def _ref_role_name(pack: dict[str, Any], role: str) -> str:
    return str(pack["roles"].get(role, role))


def _ref_roles_summary(pack: dict[str, Any], csv: str) -> str:
    parts = []
    for item in csv.split(","):
        role, _, count = item.partition(":")
        parts.append(str(pack["role_count"]).format(count=count, role=_ref_role_name(pack, role)))
    return str(pack["players_sep"]).join(parts)


def _ref_format_event(ev: Event, pack: dict[str, Any]) -> str | None:
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
        "actor": _ref_player(pack, ev.actor),
        "target": _ref_player(pack, ev.target),
        "text": ev.text,
        "day": ev.round,
    }
    if kind == "setup":
        fields["roles"] = str(pack["players_sep"]).join(
            f"{_ref_player(pack, i)}={_ref_role_name(pack, r)}" for i, r in enumerate(ev.text.split(","))
        )
    elif kind == "game_start":
        fields["roles"] = _ref_roles_summary(pack, ev.text)
        fields["n"] = sum(int(x.partition(":")[2]) for x in ev.text.split(","))
    elif kind in ("role", "reveal", "shoot"):
        fields["role"] = _ref_role_name(pack, ev.text)
    elif kind in ("wolf_team", "revote", "speaking_order"):
        fields["players"] = _ref_players(pack, ev.text)
    elif kind == "inspect":
        fields["result"] = pack["results"].get(ev.text, ev.text)
    elif kind == "game_over":
        fields["winner"] = pack["teams"].get(ev.text, ev.text)
    return str(template).format(**fields)


def _ref_rules_text(config: WerewolfConfig, pack: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for r in config.role_list():
        counts[r] = counts.get(r, 0) + 1
    roles = str(pack["players_sep"]).join(
        str(pack["role_count"]).format(count=counts[r], role=_ref_role_name(pack, r))
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


def _ref_legal_line(pack: dict[str, Any], la: LegalAction) -> str:
    template = str(pack["actions"].get(la.kind, la.kind))
    if la.kind == K_SAVE:
        return template.format(target=_ref_player(pack, la.targets[0] if la.targets else -1))
    if la.targets:
        nums = str(pack["players_sep"]).join(str(t + 1) for t in la.targets)
        return template + str(pack["targets"]).format(players=nums)
    return template


def _ref_render(
    env: WerewolfEnv,
    seat: int,
    n_events: int,
    phase: str,
    day: int,
    legal: Sequence[LegalAction],
    feedback: str,
    done: bool,
) -> str:
    pack = load_pack(env.config.language)
    role = env.roles[seat]
    lines = [
        _ref_rules_text(env.config, pack),
        "",
        str(pack["you_are"]).format(player=_ref_player(pack, seat), role=_ref_role_name(pack, role)),
        str(pack["role_guidance"][role]),
        "",
        str(pack["log_header"]),
    ]
    chans = env.visible_channels(seat)
    events = env.events
    for i in range(n_events):
        ev = events[i]
        if ev.channel in chans:
            line = _ref_format_event(ev, pack)
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
        lines.extend("- " + _ref_legal_line(pack, la) for la in legal)
        if feedback:
            lines.append(str(pack["feedback"]).format(reason=feedback))
        lines.append(str(pack["answer_format"]).format(n=env.n))
    else:
        lines.append(str(pack["wait"]))
    return "\n".join(lines) + "\n"


# --- driving games -----------------------------------------------------------------------------------

GARBAGE = ("", "vote 99", "fly to the moon", "{not json", "<think>hmm</think>", "投票给99号")


def _as_text(action: Action, rng: random.Random) -> str:
    """A structured action as the text a model might write (1-based players)."""
    if action.kind == "speak":
        return action.text or "I have nothing to add."
    if action.target is None:
        return action.kind
    return rng.choice((f"{action.kind} {action.target + 1}", f"I {action.kind} player {action.target + 1}"))


def _expected(env: WerewolfEnv, obs: Observation) -> str:
    render = obs._render
    assert render is not None
    bound_env, *args = render.args  # type: ignore[attr-defined]
    assert bound_env is env
    return _ref_render(env, *args)


def _play_and_compare(env: WerewolfEnv, seed: int, bot: Any) -> tuple[int, int]:
    """Play one game, compare every prompt read; returns (prompts compared, events)."""
    rng = random.Random(seed * 7919 + 1)
    obs, _ = env.reset(seed=seed)
    late: list[Observation] = list(obs.values())[:2]  # initial observations, read after the game
    compared = 0
    while not env.done:
        acting = env.acting_seats()
        current = env.observe(acting[0]) if acting else None
        for seat in acting:
            o = env.observe(seat)
            if rng.random() < 0.8:  # most prompts are read when made, like an LLM turn
                assert o.text == _expected(env, o)
                compared += 1
            else:
                late.append(o)
        # a waiting seat's view (the "wait" branch; night phases masked) now and then
        if rng.random() < 0.3:
            idle = rng.randrange(env.n)
            o = env.observe(idle)
            assert o.text == _expected(env, o)
            compared += 1
        actions: dict[int, Action | str] = {}
        for seat in acting:
            action = bot(env, seat, rng)
            r = rng.random()
            if r < 0.05:
                actions[seat] = rng.choice(GARBAGE)  # re-prompt: an "invalid" event and feedback
            elif r < 0.5:
                actions[seat] = _as_text(action, rng)
            else:
                actions[seat] = action
        result = env.step(actions)
        for o in result.observations.values():
            if rng.random() < 0.5:
                late.append(o)
        if current is not None and rng.random() < 0.1:
            late.append(current)
        if late and rng.random() < 0.3:  # one read late while the game goes on (others moved ahead)
            o = late.pop(rng.randrange(len(late)))
            assert o.text == _expected(env, o)
            compared += 1
    for seat in range(env.n):  # the final view of every seat
        o = env.observe(seat)
        assert o.text == _expected(env, o)
        compared += 1
    rng.shuffle(late)
    for o in late:  # observations made earlier, read only now: cut at their own event count
        assert o.text == _expected(env, o)
        compared += 1
    return compared, env.n_events


OPTIONS: list[dict[str, Any]] = [
    {},
    {"tie_rule": "revote", "witch_self_save": "always"},
    {"sheriff": True, "wolf_king": True, "speaking_order": "counterclockwise", "last_words": "always"},
    {"guard_save_rule": "lives", "win_rule": "side_kill", "discussion_rounds": 2, "wolf_chat_rounds": 2},
]


@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("variant", ["6p", "9p", "12p"])
def test_incremental_prompts_match_the_reference_renderer(variant: str, language: str) -> None:
    compared = events = 0
    for i, opts in enumerate(OPTIONS):
        env = WerewolfEnv(variant, language=language, **opts)  # one env reused across games (reset)
        for seed in range(2):
            bot = heuristic_bot if (seed + i) % 2 else random_bot
            c, e = _play_and_compare(env, 1000 * i + seed, bot)
            compared += c
            events += e
    assert compared > 100 and events > 100  # the games really ran


class _CountingTemplate(str):
    """A prompt template that counts how often it is filled."""

    calls = 0

    def format(self, *args: Any, **kwargs: Any) -> str:
        _CountingTemplate.calls += 1
        return super().format(*args, **kwargs)


def test_every_event_is_formatted_at_most_once_per_game(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-turn cost flat in game length: a game's prompts fill each event's template at most once
    (structural lines through ``_format``, speeches from the pack's templates directly), and build no
    rules after the first game of a configuration. The cross-game line memo is emptied per game, so the
    count is this game's own."""
    calls = {"format": 0, "rules": 0}
    real_format = render_mod._format
    real_rules = render_mod._build_rules

    def counting_format(*args: Any) -> str | None:
        calls["format"] += 1
        return real_format(*args)

    def counting_rules(*args: Any) -> str:
        calls["rules"] += 1
        return real_rules(*args)

    monkeypatch.setattr(render_mod, "_format", counting_format)
    monkeypatch.setattr(render_mod, "_build_rules", counting_rules)
    pc = render_mod._pack_cache(load_pack("en"))
    monkeypatch.setattr(pc, "free", {k: _CountingTemplate(v) for k, v in pc.free.items()})
    env = WerewolfEnv("12p", language="en", discussion_rounds=3)
    rng = random.Random(0)
    render_mod.render_observation(env, 0, env.n_events, "", 0, (), "", False)  # warm the rules memo
    calls["rules"] = 0
    for seed in range(3):
        env.reset(seed=seed)
        pc.lines.clear()
        calls["format"] = 0
        _CountingTemplate.calls = 0
        prompts = 0
        while not env.done:
            acting = env.acting_seats()
            for seat in acting:
                assert env.observe(seat).text
                prompts += 1
            env.step({s: random_bot(env, s, rng) for s in acting})
        for seat in range(env.n):
            assert env.observe(seat).text
        assert prompts > 50
        assert calls["format"] > 0 and _CountingTemplate.calls > 0  # both paths ran
        filled = calls["format"] + _CountingTemplate.calls
        assert filled <= env.n_events, (filled, env.n_events, prompts)
    assert calls["rules"] == 0


def test_a_replaced_event_log_starts_a_fresh_view() -> None:
    """Setting ``env.events`` (a different log) must not serve lines cached for the old one."""
    env = WerewolfEnv("6p")
    env.reset(seed=3)
    rng = random.Random(3)
    for _ in range(8):
        acting = env.acting_seats()
        for seat in acting:
            assert env.observe(seat).text
        env.step({s: random_bot(env, s, rng) for s in acting})
    seat = env.acting_seats()[0]
    before = env.observe(seat)
    assert before.text == _expected(env, before)
    env.events = env.events[:5]
    after = env.observe(seat)
    assert after.text == _expected(env, after)
    assert len(after.text) < len(before.text)
