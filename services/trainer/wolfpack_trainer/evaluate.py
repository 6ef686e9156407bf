"""Held-out evaluation, and the reference policies a trained policy is judged against.

Why references: a learning curve alone does not say whether a policy learned the *game*. On the old demo
task the one-word policy "always ACCEPT" won every held-out game, more than the trained policy, and
nothing in the summary said so. So every evaluation is read against policies measured on the **same
held-out seeds**, with the same opponents and the same outcome rule:

* ``initial`` — the policy before the first update (the step-0 evaluation, played like every other);
* ``base`` — with ``eval.base`` (by default whenever a warm start is configured, where ``initial`` is the
  clone): each trained policy's base model, its ``model`` as configured before the warm start and without
  LoRA, played once at the start of a fresh run by the same player as ``initial`` (service mode: served by
  inference as an extra policy, ``base_policy_ids``; local mode: loaded in process), so the learning line
  stands next to the model the run started from, measured on the same seeds in the same run;
* ``constant:<MOVE>`` — every constant-action policy the game allows the trainee seats: the scenario
  families' flag statements (``ACCEPT``, ``REJECT``, ...) and other games' legal actions that take no
  target and no text; a constant that is never a legal move for the trainee seats is left out (a value
  statement such as ``OFFER: <n>`` has a constant for every ``n`` and is not enumerated);
* the game's scripted bots (``random``, ``heuristic``) in the trainee seats.

The references other than ``initial`` are played here, in process, on the pure game core
(``wolfpack_games``: no services, no model), which is cheap (milliseconds per game) and deterministic:
the opponents are the config's ``game.bot`` with the bot RNG the player's environment uses
(``random.Random(seed)``), the reference seat's own bot draws from a separate RNG. Scores follow the trainer's outcome rule: a seat wins when its
game outcome is positive; its reward is the outcome minus the reward spec's penalty per invalid move
(the spec's reward without its shaping terms). Per episode, the trainee seats are averaged.

The trained policy itself is evaluated by ``Trainer.evaluate`` through the same player as training
(service mode: the rollout driver with the policy served by inference); this module turns its
trajectories into the same per-episode rows, and keeps a few of them as ``Trajectory`` files in the run
directory (``save_episodes``): the web view's training page opens them on its replay page, turn by turn
with tokens and logprobs, which the TensorBoard text transcripts cannot show.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import re
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games import Action, GameEnv, get_game, make_game
from wolfpack_trainer.metrics import Estimate, mean_ci, wilson_ci

MAX_STEPS = 200
"""Steps after which a reference game is cut (scored as unfinished: outcome 0, no win)."""

SAVED_EPISODES = 4
"""Evaluated episodes kept as files per evaluation (``save_episodes``): enough to read a few games of each
evaluation, bounded so a long run's directory grows by kilobytes per evaluation, not by the whole eval set."""
EPISODE_FILE = re.compile(r"^episode_(\d{2})\.pb$")
"""Names ``save_episodes`` writes (and the only ones it removes)."""

EpisodeRow = list[tuple[float, bool]]
"""One held-out episode: (reward, won) of each trainee seat."""


@dataclass(frozen=True)
class Reference:
    """A reference policy's score on the held-out seeds."""

    name: str
    reward: Estimate
    win_rate: Estimate

    def metric(self, name: str) -> Estimate:
        return self.win_rate if name == "win_rate" else self.reward


def eval_seeds(cfg: Any) -> list[int]:
    """The held-out seeds: ``eval.seed_offset + i`` for ``i < eval.episodes`` (disjoint from training's)."""
    return [cfg.eval.seed_offset + i for i in range(cfg.eval.episodes)]


def summarize(rows: Sequence[EpisodeRow]) -> tuple[Estimate, Estimate]:
    """(reward, win rate) over episodes, each the mean of its trainee seats. The win rate is a Wilson
    interval when every episode is a whole win or loss, else (several trainee seats per episode, split
    results) a normal interval of the per-episode means."""
    kept = [r for r in rows if r]
    rewards = [statistics.fmean(x for x, _ in r) for r in kept]
    wins = [statistics.fmean(float(w) for _, w in r) for r in kept]
    if any(0 < w < 1 for w in wins):
        return mean_ci(rewards), mean_ci(wins)
    return mean_ci(rewards), wilson_ci(round(sum(wins)), len(wins))


def trajectory_rows(
    trajectories: Sequence[trajectory_pb2.Trajectory], expected: int, policies: Sequence[str] = ()
) -> tuple[list[EpisodeRow], int]:
    """Per-episode rows of played trajectories (trainee seats: bound to a policy id, or one of
    ``policies``), and how many of ``expected`` episodes are missing (failed). Each missing episode
    counts as a loss (reward -1, no win): an evaluation never looks better because episodes failed."""
    rows: list[EpisodeRow] = []
    for traj in trajectories:
        bound = {b.seat: b.policy.policy_id for b in traj.seats if b.policy.policy_id}
        row = [
            (float(o.final_reward), o.outcome == common_pb2.OUTCOME_KIND_WIN)
            for o in traj.outcomes
            if bound.get(o.seat) and (not policies or bound[o.seat] in policies)
        ]
        rows.append(row)
    missing = max(0, expected - len(trajectories))
    rows.extend([[(-1.0, False)]] * missing)
    return rows, missing


@dataclass(frozen=True)
class PolicyScore:
    """One trained policy's held-out score, from its own seats only (``policy_scores``)."""

    reward: Estimate
    win_rate: Estimate

    def metric(self, name: str) -> Estimate:
        return self.win_rate if name == "win_rate" else self.reward


def policy_scores(
    trajectories: Sequence[trajectory_pb2.Trajectory], expected: int, policies: Sequence[str]
) -> dict[str, PolicyScore]:
    """Each trained policy's (reward, win rate) on the seats bound to it alone, when a run trains several:
    the overall estimate averages the seats of an episode, so co-trained policies (IPPO's proposer and
    responder) hide each other's progress in it. An episode where the policy holds no seat does not count
    for it (its ``n`` is the episodes it played); a missing episode is a loss for every policy, as overall.
    Empty with one policy: the overall estimate is already its own."""
    if len(policies) < 2:
        return {}
    out: dict[str, PolicyScore] = {}
    for pid in policies:
        rows, _ = trajectory_rows(trajectories, expected, [pid])
        out[pid] = PolicyScore(*summarize(rows))
    return out


def policy_metrics(scores: dict[str, PolicyScore]) -> dict[str, float]:
    """Metrics-file keys ``eval/<policy>/reward_mean``, ``eval/<policy>/reward_lo|_hi``,
    ``eval/<policy>/win_rate[_lo|_hi]``: the overall ``eval/`` keys, one level down."""
    out: dict[str, float] = {}
    for pid, score in scores.items():
        base = f"eval/{pid}"
        for key, ci, est in (
            ("reward_mean", "reward", score.reward),
            ("win_rate", "win_rate", score.win_rate),
        ):
            out[f"{base}/{key}"] = est.mean
            out[f"{base}/{ci}_lo"] = est.lo
            out[f"{base}/{ci}_hi"] = est.hi
    return out


async def play_served(
    driver: Any, tasks: Sequence[Any], temperature: float
) -> list[trajectory_pb2.Trajectory]:
    """``driver.play(tasks)`` (the rollout driver: nothing goes to the stream) sampling at the evaluation's
    ``temperature`` where the driver has a ``config.sampling`` to set; its own settings come back after."""
    config = getattr(driver, "config", None)
    sampling = getattr(config, "sampling", None)
    if config is None or sampling is None or sampling.temperature == temperature:
        return list(await driver.play(tasks))
    driver.config = dataclasses.replace(
        config, sampling=dataclasses.replace(sampling, temperature=temperature)
    )
    try:
        return list(await driver.play(tasks))
    finally:
        driver.config = config


def base_episodes_dir(run_dir: Path) -> Path:
    """Where the base models' evaluation (``eval.base``) keeps its episodes: ``<run>/eval/base/`` (the web
    view's training page lists ``update_*`` directories only)."""
    return run_dir / "eval" / "base"


def episodes_dir(run_dir: Path, step: int) -> Path:
    """Where the evaluation at update ``step`` keeps its episodes: ``<run>/eval/update_<step:06d>/`` (the
    checkpoints' naming)."""
    return run_dir / "eval" / f"update_{step:06d}"


def save_episodes(
    run_dir: Path,
    step: int,
    trajectories: Sequence[trajectory_pb2.Trajectory],
    limit: int = SAVED_EPISODES,
    directory: Path | None = None,
) -> list[Path]:
    """Keep the first ``limit`` evaluated episodes as binary ``Trajectory`` files
    ``episode_00.pb``, ``episode_01.pb``, ... in ``episodes_dir(run_dir, step)``; returns their paths.

    Each file is written beside its final name and renamed over it, so a reader (the web view polling a
    running job) sees a whole trajectory or none. An evaluation run again at the same step (a resumed run)
    replaces the files, and removes its own numbered files beyond the new count, so a directory never
    mixes two evaluations. The first episodes in seed order, so every evaluation shows the same seeds.
    ``directory`` replaces ``episodes_dir(run_dir, step)`` (the base models' evaluation: ``base_episodes_dir``)."""
    out_dir = directory or episodes_dir(run_dir, step)
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = list(trajectories)[: max(0, min(limit, 100))]
    paths = []
    for i, traj in enumerate(kept):
        path = out_dir / f"episode_{i:02d}.pb"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(traj.SerializeToString())
        os.replace(tmp, path)
        paths.append(path)
    for stale in out_dir.iterdir():
        match = EPISODE_FILE.match(stale.name)
        if match and int(match.group(1)) >= len(kept):
            stale.unlink(missing_ok=True)
    return paths


# --- the base models (eval.base) -----------------------------------------------------------------------

BASE = "base"
"""The base models' reference name (``reference: base``, ``reference/base/...`` metrics)."""


def base_policy_ids(cfg: Any) -> dict[str, str]:
    """Trained policy id -> the policy id its base model is served (service mode) or played (local mode) as:
    ``base-<policy>``, one per distinct ``model``, named after its first policy, so IPPO's policies on one
    model share one base (one inference engine, not one per policy)."""
    first: dict[str, str] = {}
    out = {}
    for p in cfg.policies:
        out[p.id] = f"{BASE}-{first.setdefault(p.model, p.id)}"
    return out


def base_models(cfg: Any, cache_dir: str | Path) -> dict[str, str]:
    """Base policy id -> the checkpoint it loads: its policies' ``model`` resolved as the learners resolve
    it, never the warm-started clone."""
    from wolfpack_trainer.learners.cpu import resolve_model_path

    ids = base_policy_ids(cfg)
    return {ids[p.id]: resolve_model_path(p.model, str(cache_dir)) for p in cfg.policies}


def bind_base(tasks: Sequence[Any], ids: dict[str, str]) -> dict[int, dict[int, str]]:
    """Rebind the trained seats of curriculum ``Task`` protos (in place) to their policies' base models
    (``ids``: ``base_policy_ids``); returns seed -> {seat: trained policy id}, what ``unbind_base`` needs
    to score the played episodes as each trained policy's seats."""
    owners: dict[int, dict[int, str]] = {}
    for task in tasks:
        own = owners.setdefault(int(task.seed), {})
        for b in task.seats:
            if b.policy.policy_id in ids:
                own[b.seat] = b.policy.policy_id
                b.policy.policy_id = ids[b.policy.policy_id]
    return owners


def unbind_base(
    trajectories: Sequence[trajectory_pb2.Trajectory], owners: dict[int, dict[int, str]]
) -> list[trajectory_pb2.Trajectory]:
    """Copies of the base models' episodes with each base-bound seat bound to the trained policy it stood
    in for (``bind_base``), so ``trajectory_rows`` and ``policy_scores`` score them seat by seat exactly as
    the trained policies' own evaluation (one base may stand in for several policies)."""
    out = []
    for traj in trajectories:
        copy = trajectory_pb2.Trajectory()
        copy.CopyFrom(traj)
        own = owners.get(int(traj.seed), {})
        for b in copy.seats:
            if b.seat in own:
                b.policy.policy_id = own[b.seat]
        out.append(copy)
    return out


def base_metrics(
    reward: Estimate, win_rate: Estimate, failed: int, policies: dict[str, Any]
) -> dict[str, float]:
    """Metrics-file keys of the base models' evaluation: ``reference/base/<metric>[_lo|_hi]`` as every
    reference, ``reference/base/failed_episodes``, and with several trained policies each one's base on its
    own seats, ``reference/base/<policy>/<metric>[_lo|_hi]`` (as ``eval/<policy>/...``)."""
    out = reference_metrics([Reference(BASE, reward, win_rate)])
    out[f"reference/{BASE}/failed_episodes"] = float(failed)
    for key, value in policy_metrics(policies).items():
        out[f"reference/{BASE}/" + key.removeprefix("eval/")] = value
    return out


# --- reference policies ---------------------------------------------------------------------------------

Move = Callable[[GameEnv, int, random.Random], "Action | str"]
"""How a reference policy answers for a trainee seat: (engine, seat, its RNG) -> a move."""


def eval_policies(cfg: Any) -> list[Any]:
    """The trained policies that play the held-out games: all but ``eval.replaces``."""
    return [p for p in cfg.policies if p.id not in cfg.eval.replaces]


def vs_bot_config(cfg: Any, pid: str) -> Any:
    """``cfg`` with every trained policy but ``pid`` replaced by ``game.bot`` in the held-out games
    (``eval.vs_bot``): ``pid``'s evaluation against the bot, its references and its held-out plan."""
    others = [p.id for p in cfg.policies if p.id != pid]
    return cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"replaces": others, "vs_bot": False})})


def vs_bot_metrics(pid: str, score: PolicyScore, refs: Sequence[Reference] = ()) -> dict[str, float]:
    """Metrics-file keys of ``pid`` against the bot: ``eval_vs_bot/<pid>/<metric>[_lo|_hi]`` (as
    ``eval/<pid>/...``) and, when given, that setting's references, ``reference_vs_bot/<pid>/<name>/...``."""
    out = {f"eval_vs_bot/{k.removeprefix('eval/')}": v for k, v in policy_metrics({pid: score}).items()}
    out.update({f"reference_vs_bot/{pid}/{k.removeprefix('reference/')}": v
                for k, v in reference_metrics(refs).items()})  # fmt: skip
    return out


def eval_role_pairs(cfg: Any, policies: Sequence[Any]) -> Iterator[tuple[str, str]]:
    """(role, policy id) of ``policies`` in the held-out games: each one's ``eval.roles`` where given, else
    its own ``roles``."""
    return ((r, p.id) for p in policies for r in cfg.eval.roles.get(p.id, p.roles))


def eval_role_map(cfg: Any) -> dict[str, str]:
    """Role -> policy id in the held-out games, of the playing policies (a role claimed twice keeps the last
    policy; ``check_config`` refuses that)."""
    return dict(eval_role_pairs(cfg, eval_policies(cfg)))


def eval_seat_map(cfg: Any) -> dict[int, str]:
    """Seat -> policy id in the held-out games (``eval.replaces`` left out)."""
    return {s: p.id for p in eval_policies(cfg) for s in p.seats}


def _trainee_seats(cfg: Any, env: GameEnv) -> set[int]:
    """The seats the trained policies take in a held-out game (``eval.roles``, ``eval.replaces``)."""
    seats = set(eval_seat_map(cfg))
    roles = set(eval_role_map(cfg))
    if roles:
        seats |= {s for s in env.possible_agents if env.role(s) in roles}
    return seats


def constant_moves(cfg: Any) -> list[str]:
    """Candidate constant actions of the config's game (see the module docstring), in a stable order."""
    from wolfpack_games.scenarios import GAME_CLASSES

    game_cls = GAME_CLASSES.get(cfg.game.id)
    if game_cls is not None:
        from wolfpack_games.scenarios import get_family

        family = get_family(game_cls.family_name)
        return [spec.keyword for spec in family.specs if not spec.takes_value]
    kinds: dict[str, None] = {}
    for seed in eval_seeds(cfg)[:8]:  # the kinds a trainee seat is offered in a few bot games
        env = make_game(cfg.game.id, cfg.game.variant)
        env.reset(seed=seed)
        bots, rng = get_game(cfg.game.id).bots, random.Random(seed)
        trainee = _trainee_seats(cfg, env)
        for _ in range(MAX_STEPS):
            if env.done:
                break
            for seat in env.acting_seats():
                if seat in trainee:
                    for legal in env.legal_actions(seat):
                        if not legal.targets and not legal.needs_text:
                            kinds.setdefault(legal.kind)
            env.step({s: bots[cfg.game.bot](env, s, rng) for s in env.acting_seats()})
    return list(kinds)


def invalid_penalty(cfg: Any) -> float:
    """The reward spec's penalty per invalid move (``rollout.invalid_penalty`` restates it when given)."""
    if cfg.rollout.invalid_penalty is not None:
        return float(cfg.rollout.invalid_penalty)
    from wolfpack_rewards import resolve_spec

    return float(resolve_spec(cfg.rollout.reward_spec, cfg.game.id).config.penalties.invalid)


def play_reference(cfg: Any, move: Move) -> tuple[list[EpisodeRow], int]:
    """Play the held-out seeds with ``move`` in the trainee seats; (per-episode rows, legal moves made)."""
    spec = get_game(cfg.game.id)
    opponent = spec.bots[cfg.game.bot]
    penalty = invalid_penalty(cfg)
    rows: list[EpisodeRow] = []
    legal_moves = 0
    for seed in eval_seeds(cfg):
        env = make_game(cfg.game.id, cfg.game.variant)
        env.reset(seed=seed)
        trainee = _trainee_seats(cfg, env)
        # the opponents' RNG of the player (the environment service's session, and local_rollout's
        # in-process environment): one random.Random(seed) drawn by the scripted seats in acting order,
        # so a reference plays the very games the policy plays, given the same moves of its own seats
        bot_rng = random.Random(seed)
        own_rng = random.Random(seed * 7919 + 2)
        invalid = dict.fromkeys(trainee, 0)
        for _ in range(MAX_STEPS):
            if env.done:
                break
            moves: dict[int, Action | str] = {}
            for seat in env.acting_seats():
                moves[seat] = move(env, seat, own_rng) if seat in trainee else opponent(env, seat, bot_rng)
            infos = env.step(moves).infos
            for seat in trainee & set(moves):
                if infos.get(seat, {}).get("invalid_reason"):
                    invalid[seat] += 1
                else:
                    legal_moves += 1
        outcome = env.outcome() if env.done else dict.fromkeys(env.possible_agents, 0)
        rows.append([(outcome[s] - penalty * invalid[s], outcome[s] > 0) for s in sorted(trainee)])
    return rows, legal_moves


def references(cfg: Any) -> list[Reference]:
    """The in-process references (constants, then the game's bots) on the config's held-out seeds;
    empty when the opponents are not scripted bots of the game (nothing to play them with here)."""
    spec = get_game(cfg.game.id)
    if cfg.game.bot not in spec.bots:
        return []
    key = (cfg.model_dump_json(include={"game", "policies", "eval", "rollout"}),)
    if key in _CACHE:
        return _CACHE[key]
    out: list[Reference] = []
    for text in constant_moves(cfg):
        rows, legal = play_reference(cfg, functools.partial(_constant, text=text))
        if legal:  # a constant the game never accepts from these seats is no policy of theirs
            out.append(Reference(f"constant:{text}", *summarize(rows)))
    for name in ("random", "heuristic"):
        if name in spec.bots:
            rows, _ = play_reference(cfg, spec.bots[name])
            out.append(Reference(name, *summarize(rows)))
    _CACHE[key] = out
    return out


_CACHE: dict[tuple[str], list[Reference]] = {}


def _constant(env: GameEnv, seat: int, rng: random.Random, *, text: str) -> Action | str:
    """The constant move as the game takes it: a flag statement as text, an action kind as an Action."""
    kinds = {legal.kind for legal in env.legal_actions(seat)}
    return Action(text) if text in kinds and text not in ("say", "final") else text


# --- printing ---------------------------------------------------------------------------------------------


def reference_line(name: str, metric: str, est: Estimate) -> str:
    """``reference: <name> <metric> <value> (95% CI <lo>..<hi>)``."""
    return f"reference: {name} {metric} {est.mean:.2f} (95% CI {est.lo:.2f}..{est.hi:.2f})"


def reference_metrics(refs: Sequence[Reference]) -> dict[str, float]:
    """Metrics-file keys ``reference/<name>/<metric>[_lo|_hi]`` (``:`` in a name becomes ``_``)."""
    out: dict[str, float] = {}
    for ref in refs:
        base = f"reference/{ref.name.replace(':', '_')}"
        for metric, est in (("reward_mean", ref.reward), ("win_rate", ref.win_rate)):
            out[f"{base}/{metric}"] = est.mean
            out[f"{base}/{metric}_lo"] = est.lo
            out[f"{base}/{metric}_hi"] = est.hi
    return out


def beats(final: Estimate, refs: Sequence[Reference], metric: str) -> tuple[list[str], list[str]]:
    """(names of the references whose value lies below the final CI's lower bound, the others)."""
    above = [r.name for r in refs if final.lo > r.metric(metric).mean]
    return above, [r.name for r in refs if r.name not in above]


def reference_lines(
    cfg: Any, initial: Estimate, final: Estimate, base: tuple[Estimate, Estimate] | None = None
) -> list[str]:
    """The summary's block before the ``learning:`` line: one ``reference:`` line per reference policy
    (``initial`` first, then ``base``: the base models' (reward, win rate) when the run measured them), then
    which of them the final estimate's 95% CI lies above (its lower bound above the reference's value on the
    same seeds)."""
    metric = cfg.eval.metric
    refs = [Reference("initial", initial, initial)]
    if base is not None:
        refs.append(Reference(BASE, *base))
    own = len(refs)
    refs += references(cfg)
    lines = [reference_line(r.name, metric, r.metric(metric)) for r in refs]
    if len(refs) == own:
        lines.append(f"  (no in-process references: the opponents ({cfg.game.bot}) are not scripted bots)")
    above, below = beats(final, refs[1:], metric)
    verdict = f"  final {metric} 95% CI lower bound {final.lo:.2f}: above {', '.join(above) or 'none'}"
    if below:
        verdict += f"; not above {', '.join(below)}"
    return [*lines, verdict]


def base_policy_lines(metric: str, base: dict[str, PolicyScore], final: dict[str, PolicyScore]) -> list[str]:
    """With several trained policies, each one's base on its own seats (``reference[<policy>]: base ...``)
    and whether that policy's final 95% CI lies above it, as the overall verdict says for the run; none
    with one policy (the overall ``reference: base`` line is its own)."""
    lines = []
    for pid, score in base.items():
        est = score.metric(metric)
        lines.append(f"reference[{pid}]: " + reference_line(BASE, metric, est).removeprefix("reference: "))
        if pid in final:
            lo = final[pid].metric(metric).lo
            lines.append(
                f"  final[{pid}] {metric} 95% CI lower bound {lo:.2f}: {'above' if lo > est.mean else 'not above'} base"
            )
    return lines
