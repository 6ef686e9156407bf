"""Scripted Werewolf bots: ``random_bot`` and ``heuristic_bot`` (signature ``bot(env, seat, rng)``).

Why these two: ``random`` is the cheapest legal-action sampler (the throughput benchmark and fuzzing
driver); ``heuristic`` is a sane baseline opponent for RL that only reads ``env.knowledge(seat)`` —
never hidden state — so it plays fair. Their speeches are plain text people can read in transcripts;
the leak tests wrap a bot in ``marked``, which tags each wolf-chat line with a unique
``wolfchat-<hex>`` marker, to prove wolf chat never reaches a non-wolf.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import lru_cache

from wolfpack_games.base import Action, GameEnv, LegalAction
from wolfpack_games.werewolf.engine import Knowledge, WerewolfEnv
from wolfpack_games.werewolf.models import (
    K_BADGE,
    K_ELECT,
    K_INSPECT,
    K_KILL,
    K_PASS,
    K_POISON,
    K_PROTECT,
    K_SAVE,
    K_SHOOT,
    K_SPEAK,
    K_VOTE,
    PH_WOLF_CHAT,
    SEER,
    WOLF_KING,
)

WOLF_CHAT_MARKER = "wolfchat-"
"""Prefix of the marker ``marked`` bots put on wolf-chat lines (leak tests only)."""

Bot = Callable[[GameEnv, int, random.Random], Action]

_TEMPLATES = {
    "en": (
        "I am a good person, trust me.",
        "I think Player {x} is suspicious.",
        "Let's listen carefully before voting.",
        "I have nothing to add.",
        "Player {x} sounded odd to me.",
    ),
    "zh": (
        "我是好人，请相信我。",
        "我觉得{x}号玩家很可疑。",
        "投票前大家仔细听。",
        "我没有什么要补充的。",
        "{x}号玩家的发言有点奇怪。",
    ),
}


@lru_cache(maxsize=64)
def _speeches(language: str, n: int) -> tuple[str, ...]:
    """All template speeches for an ``n``-seat table, formatted once (keeps the random bot fast)."""
    out: list[str] = []
    for t in _TEMPLATES.get(language, _TEMPLATES["en"]):
        if "{x}" in t:
            out.extend(t.format(x=x) for x in range(1, n + 1))
        else:
            out.append(t)
    return tuple(out)


def _wolf_chat(env: GameEnv, target: int) -> str:
    lang = env.config.language if isinstance(env, WerewolfEnv) else "en"
    if lang == "zh":
        return f"今晚刀{target + 1}号。"
    return f"Let's kill Player {target + 1} tonight."


def marked(bot: Bot) -> Bot:
    """``bot`` with a unique ``wolfchat-<hex>`` marker (``WOLF_CHAT_MARKER`` + 12 hex digits) at the start
    of each wolf-chat line, drawn from its own RNG stream so the game plays as with ``bot``. For leak
    tests: a marker seen by a non-wolf proves wolf chat leaked."""

    def play(env: GameEnv, seat: int, rng: random.Random) -> Action:
        action = bot(env, seat, rng)
        if isinstance(env, WerewolfEnv) and env.phase == PH_WOLF_CHAT and action.kind == K_SPEAK:
            tag = random.Random(f"{seat}:{len(env.events)}:{action.text}").getrandbits(48)
            return Action(action.kind, action.target, f"{WOLF_CHAT_MARKER}{tag:012x} {action.text}")
        return action

    return play


def random_bot(env: GameEnv, seat: int, rng: random.Random) -> Action:
    """A uniformly random legal action; speeches are short templates."""
    legal = env.legal_actions(seat)
    if not legal:
        return Action(K_PASS)
    la = legal[0] if len(legal) == 1 else rng.choice(legal)
    if la.needs_text:
        if isinstance(env, WerewolfEnv):
            if env.phase == PH_WOLF_CHAT:
                return Action(K_SPEAK, None, _wolf_chat(env, rng.randrange(env.n)))
            return Action(K_SPEAK, None, rng.choice(_speeches(env.config.language, env.n)))
        return Action(la.kind, None, "...")
    if la.targets:
        return Action(la.kind, rng.choice(la.targets))
    return Action(la.kind)


# --- heuristic ---------------------------------------------------------------------------------------


def _suspicion(k: Knowledge) -> dict[int, float]:
    """Village-side suspicion of every other living seat, from what ``k`` may know."""
    score = {s: 0.0 for s, a in enumerate(k.alive) if a and s != k.seat}
    for t, res in k.seer_results.items():
        if t in score:
            score[t] += 100.0 if res == "werewolf" else -100.0
    for claimer, claims in k.seer_claims.items():
        if claims.get(k.seat) == "werewolf" and claimer in score:
            score[claimer] += 50.0  # a "seer" calling me a wolf is lying: I know I am good
            continue
        if k.seer_results.get(claimer) == "werewolf":
            continue
        if claimer in score:
            score[claimer] -= 2.0
        for t, res in claims.items():
            if t in score:
                score[t] += 5.0 if res == "werewolf" else -3.0
    trusted_seers = {c for c in k.seer_claims if score.get(c, 0.0) < 50.0 or c == k.seat}
    claimed_wolves = {t for c in trusted_seers for t, r in k.seer_claims[c].items() if r == "werewolf"}
    for _day, voter, target in k.votes:
        if voter in score and target >= 0:
            if target in trusted_seers:
                score[voter] += 3.0  # voting out the (trusted) seer is what wolves do
            elif target in claimed_wolves:
                score[voter] -= 1.0
    for t, role in k.known_roles.items():
        if t in score:
            score[t] += 100.0 if role in ("werewolf", WOLF_KING) else -100.0
    return score


def _best(score: dict[int, float], allowed: tuple[int, ...], rng: random.Random) -> int | None:
    cands = [t for t in allowed if t in score]
    if not cands:
        return None
    top = max(score[t] for t in cands)
    best = [t for t in cands if score[t] == top]
    return best[0] if len(best) == 1 else rng.choice(best)


def _claimed_seers(k: Knowledge) -> list[int]:
    return [c for c in k.seer_claims if k.alive[c]]


def _wolf_pick(k: Knowledge, targets: tuple[int, ...]) -> int:
    """The pack's shared kill target: a claimed seer, else a choice every wolf computes identically
    from public facts (day and who is alive), so scripted wolves coordinate without reading chat."""
    seers = [c for c in _claimed_seers(k) if c in targets]
    if seers:
        return seers[0]
    return targets[(k.day * 2654435761 + sum(k.alive) * 40503) % len(targets)]


def _speech(env: WerewolfEnv, k: Knowledge, rng: random.Random) -> str:
    zh = env.config.language == "zh"
    if env.phase == PH_WOLF_CHAT:
        mates = set(k.wolf_teammates)
        non_wolves = tuple(s for s, a in enumerate(k.alive) if a and s not in mates and s != k.seat)
        return _wolf_chat(env, _wolf_pick(k, non_wolves) if non_wolves else k.seat)
    if k.role == SEER and k.seer_results:
        if zh:
            checks = "".join(
                f"{t + 1}号是{'狼人' if r == 'werewolf' else '好人'}。"
                for t, r in sorted(k.seer_results.items())
            )
            return f"我是预言家。{checks}"
        checks = " ".join(
            f"Player {t + 1} is {'a werewolf' if r == 'werewolf' else 'good'}."
            for t, r in sorted(k.seer_results.items())
        )
        return f"I am the seer. {checks}"
    if k.team == "wolves":
        others = [s for s, a in enumerate(k.alive) if a and s != k.seat and s not in k.wolf_teammates]
    else:
        score = _suspicion(k)
        top = _best(score, tuple(score), rng)
        others = [top] if top is not None else []
    if not others:
        return "我没有什么要补充的。" if zh else "I have nothing to add."
    x = rng.choice(others) + 1
    return f"我觉得{x}号玩家很可疑。" if zh else f"I think Player {x} is suspicious."


def heuristic_bot(env: GameEnv, seat: int, rng: random.Random) -> Action:
    """A simple, fair rule-based player (reads only ``env.knowledge(seat)``).

    Wolves never vote for or kill a teammate, kill claimed seers at night and vote like villagers by
    day (the top public suspect who is not a wolf); the seer inspects unknown
    players and reveals its checks when it speaks; the witch saves the first victim she can and
    poisons a publicly exposed wolf; the guard protects a claimed seer or rotates; villagers vote for
    claimed wolves, else their top suspect.
    """
    legal = env.legal_actions(seat)
    if not legal:
        return Action(K_PASS)
    if not isinstance(env, WerewolfEnv):  # pragma: no cover - only werewolf uses this bot
        return random_bot(env, seat, rng)
    k = env.knowledge(seat)
    kinds: dict[str, LegalAction] = {la.kind: la for la in legal}
    if K_SPEAK in kinds:
        return Action(K_SPEAK, None, _speech(env, k, rng))
    wolf = k.team == "wolves"
    mates = set(k.wolf_teammates)

    def non_wolf(targets: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(t for t in targets if t != seat and t not in mates)

    if K_KILL in kinds:
        targets = non_wolf(kinds[K_KILL].targets) or kinds[K_KILL].targets
        return Action(K_KILL, _wolf_pick(k, targets))
    if K_INSPECT in kinds:
        targets = kinds[K_INSPECT].targets
        unknown = [t for t in targets if t not in k.seer_results]
        return Action(K_INSPECT, rng.choice(unknown or list(targets)))
    if K_SAVE in kinds:
        return Action(K_SAVE, kinds[K_SAVE].targets[0])
    if K_POISON in kinds:
        score = _suspicion(k)
        t = _best(score, kinds[K_POISON].targets, rng)
        if t is not None and score[t] >= 5.0:
            return Action(K_POISON, t)
        return Action(K_PASS)
    if K_PROTECT in kinds:
        targets = kinds[K_PROTECT].targets
        seers = [c for c in _claimed_seers(k) if c in targets]
        if seers:
            return Action(K_PROTECT, seers[0])
        return Action(K_PROTECT, rng.choice(targets)) if targets else Action(K_PASS)
    for kind in (K_VOTE, K_ELECT, K_BADGE, K_SHOOT):
        if kind not in kinds:
            continue
        targets = kinds[kind].targets
        if wolf:
            if kind in (K_ELECT, K_BADGE):
                friends = [t for t in targets if t in mates or t == seat]
                if friends:
                    return Action(kind, rng.choice(friends))
            good = non_wolf(targets)
            if not good:
                return Action(K_PASS)
            if kind == K_VOTE:
                # Blend in by day: vote like a villager would (top public suspect among non-wolves).
                pick = _best(_suspicion(k), good, rng)
                return Action(kind, pick if pick is not None else rng.choice(good))
            seers = [c for c in _claimed_seers(k) if c in good]
            return Action(kind, seers[0] if seers else rng.choice(good))
        score = _suspicion(k)
        if kind in (K_ELECT, K_BADGE):
            # Back the most trusted player (self if seer), never the top suspect.
            if kind == K_ELECT and k.role == SEER and seat in targets:
                return Action(kind, seat)
            trusted = [t for t in targets if t != seat and score.get(t, 0.0) <= 0.0]
            low = min((score.get(t, 0.0) for t in trusted), default=None)
            backed = [t for t in trusted if score.get(t, 0.0) == low]
            return Action(kind, rng.choice(backed)) if backed else Action(K_PASS)
        t = _best(score, targets, rng)
        if t is None or (kind == K_SHOOT and score[t] <= 0.0):
            return Action(K_PASS)
        return Action(kind, t)
    return env.default_action(seat)
