"""Hidden information never reaches a seat that may not know it (property test over random games).

The oracle is built from the engine's ground truth (``env.roles``, ``env.events``), not from the
channel filter the renderer uses, so a wrong channel on an event is caught.
"""

from __future__ import annotations

import random
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wolfpack_games.base import Action, Observation
from wolfpack_games.werewolf import WerewolfEnv, random_bot
from wolfpack_games.werewolf.policies import WOLF_CHAT_MARKER, marked
from wolfpack_games.werewolf.render import load_pack

MARKED_RANDOM = marked(random_bot)  # tags every wolf-chat line with a unique WOLF_CHAT_MARKER

# Phrases that only appear in private event lines (per language): who may see them.
PRIVATE_PHRASES: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {
        "seer": (" inspected ",),
        "witch": (
            "The wolves attacked",
            "Nobody was attacked",
            "used the antidote",
            "used the poison",
            "used no potion",
        ),
        "guard": (" protected ",),
        "wolves": ("The werewolves will attack", "votes to kill", "The werewolves are", "[wolves]"),
    },
    "zh": {
        "seer": ("查验了",),
        "witch": ("遭到袭击", "今晚没有人被袭击", "使用了解药", "使用了毒药", "没有用药"),
        "guard": ("守护了", "没有守护任何人"),
        "wolves": ("今晚将袭击", "投票刀", "狼队成员", "[狼队]"),
    },
}

# Phases a seat may see while it is not acting (night sub-phases would reveal who holds a power).
OPEN_PHASES = {"night", "last_words", "badge_pass", "shoot", "sheriff_vote", "day_discussion", "day_vote"}

GARBAGE = [
    "",
    "   ",
    "vote 99",
    "kill 0",
    "¯\\_(ツ)_/¯ <<>>",
    "<think>I am secretly thinking</think>",
    "<think>unclosed",
    "投票给99号",
    "\x00\x01\u202e\ufeff",
    "{not json",
    '{"action": "fly", "target": 2}',
    "x" * 5000,
    "vote 1 vote 2 vote 3",
]


def _player_re(lang: str, seat: int) -> re.Pattern[str]:
    if lang == "zh":
        return re.compile(rf"(?<!\d){seat + 1}号玩家")
    return re.compile(rf"Player {seat + 1}(?!\d)")


class Oracle:
    """Ground truth of what each seat may know, built from the engine's own state and full log."""

    def __init__(self, env: WerewolfEnv) -> None:
        self.env = env
        self.lang = env.config.language
        self.pack = load_pack(self.lang)
        self.role_names = {r: str(n).lower() for r, n in self.pack["roles"].items()}
        self.player_res = [_player_re(self.lang, s) for s in range(env.n)]

    def allowed_roles(self, seat: int, n_events: int, done: bool) -> set[int]:
        env = self.env
        if done:
            return set(range(env.n))
        allowed = {seat}
        if env.is_wolf[seat]:
            allowed |= set(env.wolves)
        for e in env.events[:n_events]:
            if e.kind == "shoot" and e.channel == "public" and e.target >= 0:
                allowed.add(e.actor)
            if e.kind == "inspect" and e.actor == seat:
                allowed.add(e.target)
        return allowed

    def check_text(self, seat: int, obs: Observation, n_events: int) -> None:
        env = self.env
        text = obs.text
        low_lines = [ln.lower() for ln in text.splitlines()]
        role = env.roles[seat]
        allowed = self.allowed_roles(seat, n_events, obs.done)
        for t in range(env.n):
            if t in allowed:
                continue
            name = self.role_names[env.roles[t]]
            pat = self.player_res[t]
            for line, low in zip(text.splitlines(), low_lines, strict=True):
                if pat.search(line) and name in low:
                    raise AssertionError(f"seat {seat} sees role of {t} ({name}) in: {line!r}")
        if not obs.your_turn and not obs.done:
            wolf_phase = env.is_wolf[seat] and obs.phase in ("night_wolf_chat", "night_wolf_vote")
            assert obs.phase in OPEN_PHASES or wolf_phase, f"seat {seat} sees night phase {obs.phase}"
        phrases = PRIVATE_PHRASES[self.lang]
        if role != "seer":
            self._absent(seat, text, phrases["seer"])
        if role != "witch":
            self._absent(seat, text, phrases["witch"])
        if role != "guard":
            self._absent(seat, text, phrases["guard"])
        if not env.is_wolf[seat]:
            self._absent(seat, text, phrases["wolves"])
            assert WOLF_CHAT_MARKER not in text, f"wolf chat reached seat {seat}"
            for e in env.events:
                if e.kind == "wolf_speech" and WOLF_CHAT_MARKER in e.text:
                    assert e.text not in text, f"wolf chat {e.text!r} reached seat {seat}"
        suffix = re.escape(str(self.pack["events"]["role"]).split("{role}")[0].replace("{actor}", ""))
        for t in range(env.n):
            if t != seat:
                assert re.search(self.player_res[t].pattern + suffix, text) is None, "role event leaked"

    @staticmethod
    def _absent(seat: int, text: str, phrases: tuple[str, ...]) -> None:
        for p in phrases:
            assert p not in text, f"seat {seat} sees private phrase {p!r}"

    def check_knowledge(self, seat: int) -> None:
        env = self.env
        k = env.knowledge(seat)
        role = env.roles[seat]
        allowed = self.allowed_roles(seat, len(env.events), env.done)
        assert set(k.known_roles) <= allowed, (seat, k.known_roles, allowed)
        for t, r in k.known_roles.items():
            assert env.roles[t] == r
        for t, r in k.revealed.items():
            assert env.roles[t] == r
            assert env.done or any(
                e.kind == "shoot" and e.actor == t and e.channel == "public" for e in env.events
            )
        # The truth from the seating itself, not from the engine's own inspect events.
        wolf_roles = ("werewolf", "wolf_king")
        truth_checks = {
            e.target: "werewolf" if env.roles[e.target] in wolf_roles else "good"
            for e in env.events
            if e.kind == "inspect"
        }
        assert k.seer_results == (truth_checks if role == "seer" else {})
        if not env.is_wolf[seat]:
            assert k.wolf_teammates == () and k.wolf_target == -1
        else:
            assert set(k.wolf_teammates) == set(env.wolves) - {seat}
        if role != "witch":
            assert k.night_victim == -1 and not k.save_left and not k.poison_left
        if role != "guard":
            assert k.last_protected == -1
        assert k.role == role and k.alive == tuple(env.alive)
        if seat not in env.acting_seats() and not env.done:
            wolf_phase = env.is_wolf[seat] and k.phase in ("night_wolf_chat", "night_wolf_vote")
            assert k.phase in OPEN_PHASES or wolf_phase, f"seat {seat} knows night phase {k.phase}"


def run_game(variant: str, seed: int, lang: str, p_garbage: float, options: dict[str, Any]) -> WerewolfEnv:
    env = WerewolfEnv(variant, language=lang, **options)
    env.reset(seed=seed)
    oracle = Oracle(env)
    rng = random.Random(seed)
    kept: list[tuple[int, Observation, int]] = []
    steps = 0
    while not env.done:
        acting = env.acting_seats()
        actions: dict[int, Action | str] = {}
        for s in acting:
            actions[s] = rng.choice(GARBAGE) if rng.random() < p_garbage else MARKED_RANDOM(env, s, rng)
        result = env.step(actions)
        n_events = len(env.events)
        for s, obs in result.observations.items():
            oracle.check_text(s, obs, n_events)
        for s in env.possible_agents:
            if s not in result.observations and (steps % 3 == 0):
                oracle.check_text(s, env.observe(s), n_events)
            oracle.check_knowledge(s)
        if steps % 7 == 0 and acting and not env.done:
            kept.append((acting[0], env.observe(acting[0]), n_events))
        steps += 1
    # lazily rendered observations made earlier only show the events that existed then
    for s, obs, n in kept:
        oracle.check_text(s, obs, n)
        assert "Game over" not in obs.text and "游戏结束：" not in obs.text
    return env


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    variant=st.sampled_from(["6p", "9p", "12p"]),
    seed=st.integers(0, 10_000),
    lang=st.sampled_from(["en", "zh"]),
    p_garbage=st.sampled_from([0.0, 0.1, 0.3]),
    tie_rule=st.sampled_from(["no_exile", "revote"]),
    last_words=st.sampled_from(["first_night", "always", "never"]),
    wolf_king=st.booleans(),
    sheriff=st.booleans(),
)
def test_no_hidden_information_leaks(
    variant: str,
    seed: int,
    lang: str,
    p_garbage: float,
    tie_rule: str,
    last_words: str,
    wolf_king: bool,
    sheriff: bool,
) -> None:
    options = {"tie_rule": tie_rule, "last_words": last_words, "wolf_king": wolf_king, "sheriff": sheriff}
    env = run_game(variant, seed, lang, p_garbage, options)
    assert env.done


def test_oracle_catches_a_leak() -> None:
    """The oracle itself works: a wolf-channel event mis-routed to the public is detected."""
    env = WerewolfEnv("6p")
    env.reset(seed=1)
    oracle = Oracle(env)
    villager = next(s for s in range(6) if not env.is_wolf[s])
    env._emit("wolf_team", "public", text=",".join(map(str, env.wolves)))
    try:
        oracle.check_text(villager, env.observe(villager), len(env.events))
    except AssertionError:
        return
    raise AssertionError("oracle missed a leak")


def test_end_of_game_reveals_roles_to_all() -> None:
    env = WerewolfEnv("6p")
    env.reset(seed=2)
    rng = random.Random(2)
    while not env.done:
        env.step({s: MARKED_RANDOM(env, s, rng) for s in env.acting_seats()})
    for s in range(6):
        k = env.knowledge(s)
        assert k.known_roles == dict(enumerate(env.roles))
        text = env.observe(s).text
        for t in range(6):
            name = load_pack("en")["roles"][env.roles[t]]
            assert f"Player {t + 1} was {name}." in text
