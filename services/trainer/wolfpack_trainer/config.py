"""Training run configuration: one YAML file (``configs/*.yaml``) validated by strict pydantic models.

Why strict (``extra="forbid"``): a typo such as ``clip_ratoi: 0.1`` must fail loudly, not train with the
default. Names (game, estimator, learner, policy loss) are checked against their registries at load time,
so a recipe that cannot run fails in ``wolfpack train --check`` and in CI, not an hour into a run.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from wolfpack_trainer.algos import AlgoConfig
from wolfpack_trainer.batch import BatchConfig
from wolfpack_trainer.learners.base import LearnerConfig, LossConfig

TRACKERS: dict[str, str] = {
    "console": "",
    "tensorboard": "",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "swanlab": "swanlab",
    "clearml": "clearml",
    "trackio": "trackio",
    "vemlp_wandb": "volcengine_ml_platform",
    "file": "orjson",
}
"""``train.tracking`` names (verl ``Tracking``'s backends) → the package each needs (checked at load)."""
ALWAYS_TRACKED = frozenset({"console", "tensorboard"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GameSection(_Strict):
    id: str
    variant: str = ""
    bot: str = "heuristic"
    """Scripted bot for every seat no trained policy takes."""
    language: str = "en"
    options: dict[str, Any] = Field(default_factory=dict)


class PolicySection(_Strict):
    """One trained policy. ``seats`` (by index) or ``roles`` say where it plays; IPPO = one learner each."""

    id: str
    seats: list[int] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)
    learner: str = "cpu"
    model: str = "tiny"
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_target_modules: list[str] = Field(default_factory=list)
    lr: float = 1e-5
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    mini_batch_size: int = 0
    micro_batch_size: int = 16
    target_kl: float = Field(default=0.0, ge=0.0)
    """End an update before the first optimiser step whose mini-batch's per-token KL (k3) from the policy
    the update started with exceeds this (0: never): one update must not carry the policy far from the one
    that sampled its batch (``LearnerConfig.target_kl``; the CPU learner's, others refuse it)."""
    value_head: bool = False
    device: str = "auto"
    """``auto``: the learner's natural device (``verl_fsdp``: CUDA when present); ``cpu``; ``cuda[:n]``
    (an error where there is no such device, never a silent CPU run)."""
    extra: dict[str, Any] = Field(default_factory=dict)


class WarmStartSection(_Strict):
    """Behaviour-clone ``bot`` into the base model before RL (see warmstart.py); ``steps: 0`` skips it."""

    bot: str = "random"
    episodes: int = 100
    steps: int = 40
    lr: float = 3e-3
    format_only: bool = False
    """Clone the bot's moves but answer speech turns with one neutral sentence (warmstart.py)."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """``bf16``: the clone's forward passes under bfloat16 autocast (weights and optimiser stay float32).
    Why: on an H100 an 800-step float32 clone of SmolLM2 took 283 of a village run's 294 s of set-up,
    inside the 20 minutes the run is judged by. ``fp32`` (the default) is how every measured recipe built
    its clone."""
    pass_tokens: int = Field(default=16_384, gt=0)
    """Most padded tokens (rows x longest row) in one of the clone's forward/backward passes: a batch above
    it is cut into passes whose gradients add up to the batch's. Why: in ``rollout.prompt: conversation``
    the clone's prompts are whole conversations (~8k tokens for 12-player Werewolf) and one 16-row pass ran
    out of an H200's memory. Changes memory, not the clone (never in its cache key)."""
    check_decisions: int = Field(default=256, ge=0)
    """After its build the clone answers this many of the bot's decisions from held-out games greedily; the
    fraction it answers as the bot did (moves and speeches apart) goes into its record, the run's step-0
    metrics (``warmstart/agree_moves``) and the summary's warm-start line. 0: no check. Why: a run that starts
    at 0.00 (the 12p village) must tell a poor clone from a table where a fair clone cannot win; the clone's
    loss does not. A measurement, not the clone (never in its cache key)."""


class OpponentPolicy(_Strict):
    """A policy served by inference that plays opponent seats and is never trained: a frozen checkpoint
    directory or an HF id (``transformers``/``vllm`` backend), or a larger model behind an OpenAI-compatible
    endpoint (``backend: openai`` with ``base_url`` and ``remote_model``). Service mode only: the job's stack
    serves it (or the running stack gets it registered), and ``rollout.opponents`` names it by ``id``."""

    id: str
    model: str = ""
    backend: Literal["auto", "transformers", "vllm", "openai"] = "auto"
    """``auto``: whatever serves the trained policies (the ``inference`` section's backend)."""
    base_url: str = ""
    remote_model: str = ""

    @model_validator(mode="after")
    def _complete(self) -> OpponentPolicy:
        if self.backend == "openai" and not (self.base_url and self.remote_model):
            raise ValueError(f"opponent policy {self.id}: backend openai needs base_url and remote_model")
        if self.backend != "openai" and not self.model:
            raise ValueError(f"opponent policy {self.id}: give model (a checkpoint directory or HF id)")
        return self


class OpponentMix(_Strict):
    """Fraction of episode groups whose non-trainee seats are played by scripted ``bot`` or by served
    ``policy`` (an ``opponent_policies`` id) instead of ``game.bot``; exactly one of the two."""

    bot: str = ""
    policy: str = ""
    fraction: float = Field(gt=0.0, le=1.0)
    replaces: list[str] = Field(default_factory=list)
    """Trained policy ids whose seats (and roles) this entry's groups hand to its ``bot`` / ``policy``: how a
    self-play run, whose policies take every seat, plays some groups against a fixed opponent (e.g. the
    bargaining seller's seat to the heuristic bot in 20 % of groups, so that the buyer keeps meeting deals a
    skilled counterpart would make). The replaced policy trains on nothing from those groups."""
    roles: list[str] = Field(default_factory=list)
    """Only the untrained seats dealt these roles go to this entry's ``bot`` / ``policy``; the other untrained
    seats keep ``game.bot``. Empty: every untrained seat. Why: a policy trained on some of a team's roles (the
    12p villagers among scripted seer, witch, guard and hunter) meets a frozen checkpoint on the *other* team
    only, instead of having its teammates replaced by it too."""

    @model_validator(mode="after")
    def _one(self) -> OpponentMix:
        if bool(self.bot) == bool(self.policy):
            raise ValueError("rollout.opponents: give exactly one of bot (scripted) or policy (served)")
        return self


class RolloutSection(_Strict):
    """``local``: the learner's model plays in process; ``service``: the rollout service's driver plays
    through environment + inference and the trainer pushes weights to inference."""

    mode: Literal["local", "service"] = "local"
    episodes_per_update: int = 32
    group_size: int = 8
    max_tokens: int = 32
    temperature: float = 1.0
    invalid_penalty: float | None = None
    """The reward spec's penalty per invalid turn, restated (``None``: the spec's own); a different value is
    refused, since the spec (``reward_spec``, or the game's default) is what scores, in both modes."""
    prompt: Literal["observation", "full_history", "conversation"] = "observation"
    """``observation``: step-independent prompts (the driver's ``memory`` mode: opening context plus what
    is new since the seat's last decisions); ``full_history``: the environment's whole observation;
    ``conversation``: one growing chat per seat-game (the whole first observation, then each answer and a
    user message of what is new), each prompt extending the previous prompt + answer token for token, so
    ``batch.layout: episode`` trains one sequence per seat-game as verl's agent loop does (the driver's
    ``conversation`` mode)."""
    max_prompt_tokens: int = Field(default=0, ge=0)
    """Keep only the last N tokens of each templated prompt (0: all), in the ``observation`` and
    ``full_history`` modes: the rollout driver sends the cropped ids as a token prompt
    (``RolloutConfig.max_prompt_tokens``), so local play and the services see the same prompt. A cost knob
    for small CPU models. With ``conversation`` it is the conversation's budget instead (a crop would
    break the prefix the next turn extends): past it a seat's conversation starts again from the
    ``observation`` mode's view of the current observation (a new sample in the episode layout); set it
    at the policy's context less ``max_tokens``."""
    opponents: list[OpponentMix] = Field(default_factory=list)
    reward_spec: str = ""


class TrainSection(_Strict):
    updates: int = 10
    max_minutes: float = Field(default=0.0, ge=0.0)
    """Training-time budget (0: none): the run ends after the update that passes it, with its checkpoint,
    final evaluation and learning line; a rerun resumes towards ``updates``."""
    push_every: int = 1
    checkpoint_every: int = 1
    max_staleness: int = 2
    """Trajectories more than this many versions behind the learner are dropped (counted)."""
    freeze_every: int = 0
    """Register a frozen snapshot in the curriculum's league every k updates (0: never)."""
    save_versions: bool = True
    """Write each published version as a loadable directory (HF or peft) under <run>/policies/."""
    weight_sync: Literal["auto", "push", "path"] = "auto"
    """How a new version reaches the inference service (service mode): ``push`` streams the weights over
    gRPC (``PushWeights``, no shared filesystem needed), ``path`` has inference load the version directory
    this host just wrote (``LoadPolicy``: the same-host fast path; needs ``save_versions``), ``auto`` takes
    ``path`` for an inference service on a loopback address, else ``push``, and falls back to ``push`` if
    inference cannot read the directory (``wolfpack_trainer.publish``)."""
    share_policy: bool = False
    """True: one learner for all policies (role in the prompt), updated once per training step on the samples
    of every policy (each policy's advantages computed on its own samples, then one batch: one old-log-prob
    pass, one optimiser step sequence); False: IPPO, one learner per policy, each updated on its own samples."""
    parallel_learners: bool = False
    """Several learners (IPPO): each update's learners train side by side, one thread each, and their new
    versions are written and sent to inference side by side. Each learner's arithmetic is its own, so the
    results are those of one after the other (the default). Why: IPPO on one H200 spent 15.0 s of a 27.1 s
    update training its two learners one after the other and 10.4 s publishing them one after the other
    (bench/results/2026-11-27-h200x4-hold-s19.md), neither learner filling the card. Off by default because
    on that card it did not pay: side by side (NCCL, one H200, s22) each learner trained ~2.2x slower beside
    the other and an update took 27.5 s against 27.1 s, only publishing got faster (6.2 s against 10.4 s;
    bench/results/2026-11-28-h200x4-hold-s22.md); learners on separate cards are untried. On the CPU both the
    CPU learner and verl's FSDP2 learner on gloo give exactly the one-after-the-other results side by side
    (services/trainer/tests/test_parallel_learners.py)."""
    tracking: list[str] = Field(default_factory=list)
    """Experiment trackers through verl's ``Tracking`` (``wandb``, ``mlflow``, ``swanlab``, ``clearml``,
    ``trackio``, ``file``, ...), fed the same rows as ``metrics.jsonl``. ``console`` and ``tensorboard`` are
    always on (the per-update line, ``<run>/tb``): naming them is allowed and changes nothing. Each tracker
    reads its own environment (``WANDB_MODE=offline``, ``MLFLOW_TRACKING_URI``, ``VERL_FILE_LOGGER_PATH``)."""
    tracking_project: str = "wolfpack"
    """The trackers' project name; the run is named after the config's ``name``."""

    @model_validator(mode="after")
    def _check_weight_sync(self) -> TrainSection:
        if self.weight_sync == "path" and not self.save_versions:
            raise ValueError("train.weight_sync path loads the version directories: it needs save_versions")
        return self

    @model_validator(mode="after")
    def _check_tracking(self) -> TrainSection:
        for name in self.tracking:
            if name not in TRACKERS:
                raise ValueError(f"train.tracking: unknown tracker {name!r}; valid: {', '.join(TRACKERS)}")
            package = TRACKERS[name]
            if package and importlib.util.find_spec(package) is None:
                raise ValueError(
                    f"train.tracking: {name} needs the {package!r} package (pip install {package})"
                )
        if len(set(self.tracking)) != len(self.tracking):
            raise ValueError("train.tracking: a tracker is named twice")
        return self

    @property
    def extra_trackers(self) -> list[str]:
        """The trackers besides the always-on console line and TensorBoard files (what ``MetricsWriter``
        hands to verl's ``Tracking``)."""
        return [t for t in self.tracking if t not in ALWAYS_TRACKED]


class EvalSection(_Strict):
    every: int = 5
    episodes: int = 64
    seed_offset: int = 1_000_000
    temperature: float = 1.0
    metric: Literal["win_rate", "reward"] = "win_rate"
    roles: dict[str, list[str]] = Field(default_factory=dict)
    """Per trained policy (by id), the roles it plays in the held-out games instead of the roles it trains
    on; the seats of every other role play ``game.bot``, in the policy's evaluation, the base model's and the
    references'. Why: a self-play policy (one policy on every role) evaluated on every seat plays itself, so
    its win rate moves with which side improved, not with skill (the AIW recipe's first GPU run read 0.45 ->
    0.44 that way). ``{shared: [villager, seer, witch]}`` measures the village against the heuristic wolves;
    a second evaluation-only run with ``{shared: [werewolf]}`` the wolves (``train.updates=0`` in a new run
    directory whose policy ``model`` is the trained version; the trained run's own directory refuses another
    eval section). Only for policies that train by ``roles``."""
    replaces: list[str] = Field(default_factory=list)
    """Trained policy ids whose seats and roles the held-out games give to ``game.bot``, so that the other
    policies are measured against the bot rather than against each other: a self-play run of seat policies
    (the bargaining buyer and seller of one shared learner) evaluated with ``replaces: [seller]`` scores the
    buyer against the heuristic seller (the references and the base model in the buyer's seat alike). The
    ``eval.roles`` of role policies, for seats."""
    vs_bot: bool = False
    """With several trained policies: every evaluation also plays each policy alone against ``game.bot``,
    which takes every other trained policy's seats and roles (as ``replaces`` would, one policy at a time),
    on the same held-out seeds, with that setting's own references (constants, random, heuristic in the
    policy's seats against the bot) and its own ``learning vs-bot[<policy>]:`` line. Why: co-trained policies
    scored against each other (IPPO's proposer and responder) can each improve against the other without
    getting better against a fixed opponent, the score that compares across runs. Costs one more evaluation
    per trained policy."""
    base: bool | None = None
    """Also evaluate each trained policy's *base model* (its ``model`` as configured: before any warm start,
    without LoRA) once, at the start of a fresh run, on the same held-out seeds with the same temperature,
    prompts and opponents: the summary's ``reference: base`` line. ``None`` (the default) means on exactly
    when a warm start is configured: then the update-0 policy (``initial``) is the clone, so the learning
    line alone cannot say where the model itself stood. Without a warm start the base *is* the update-0
    policy, and ``true`` is refused (a second measurement of ``initial``); ``false`` skips it (service mode:
    no inference engine for the base, so the others keep a larger share of ``gpu_memory_utilization``)."""
    base_overlap: bool = False
    """Service mode: play the base models' evaluation beside the update-0 evaluation and the first updates,
    through a rollout driver of its own, instead of before them; the run waits for it before its final
    evaluation (a run stopped before it ends evaluates the base again when resumed). Why: the base is only
    needed for the final ``reference: base`` line, and on a GPU its evaluation is long (a base model that
    never learned the answer format writes to ``rollout.max_tokens`` on every turn: 164-170 s of a 12-player
    run's 30-minute hold in s25 and s26, against 43 s for the clone's evaluation). Off by default: on CPUs
    the two evaluations compete for the same cores and gain nothing. No effect where no base is evaluated
    (``eval.base`` off, no warm start: the agent-loop script's final evaluation of a recipe that sets it) or
    in local mode (one process plays both, one after the other): ``TrainConfig.base_beside_training``."""


class CurriculumSection(_Strict):
    """The curriculum of a service-mode run. The job's stack runs its curriculum service with one bucket made
    from this config (game, variant, options, bot, group size, seed, the first policy's id) plus these knobs,
    and the trainer draws each update's task seeds from it (``NextTasks``), so ``aiw`` reweighting and
    ``replay_ratio`` replays decide which seeds are played; seats are then bound by the trainer (``seats`` /
    ``roles`` and ``rollout.opponents``). ``aiw`` and ``league`` take the curriculum service's own keys
    (``services/curriculum/wolfpack_curriculum/aiw.py``, ``league.py``), checked by ``--check``."""

    aiw: dict[str, Any] = Field(default_factory=dict)
    league: dict[str, Any] = Field(default_factory=dict)
    replay_ratio: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of groups that replay a past task (drawn by AIW weight); the rest are fresh seeds."""
    recent_window: int = Field(default=100, ge=1)


class StreamSection(_Strict):
    name: str = "wolfpack:trajectories"
    group: str = "trainer"
    claim_idle_ms: int = 2000


class InferenceSection(_Strict):
    """How the job's own stack serves the policies (service mode, when ``wolfpack train`` starts the stack).

    ``backend`` ``auto``: vLLM where CUDA and vLLM are present, else transformers. On one GPU the learner and
    vLLM share the card: ``gpu_memory_utilization`` is vLLM's share (weights + KV cache), split evenly among the
    engines the job starts (one per trained policy and per served opponent); the learner gets the rest (for more
    room: ``extra: {param_offload: true, optimizer_offload: true}`` on a ``verl_fsdp`` policy).
    """

    backend: Literal["auto", "transformers", "vllm"] = "auto"
    gpu_memory_utilization: float = Field(default=0.35, gt=0.0, lt=1.0)
    enforce_eager: bool = True
    """vLLM without CUDA graphs: starts in seconds instead of ~30 s; slower decode at large batch."""
    device: str = "auto"
    """transformers backend: ``auto``, ``cpu`` or ``cuda[:n]``."""


class TrainConfig(_Strict):
    name: str
    description: str = ""
    seed: int = 0
    game: GameSection
    policies: list[PolicySection]
    warmstart: WarmStartSection | None = None
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    algo: dict[str, Any] = Field(default_factory=dict)
    loss: dict[str, Any] = Field(default_factory=dict)
    batch: dict[str, Any] = Field(default_factory=dict)
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    stream: StreamSection = Field(default_factory=StreamSection)
    inference: InferenceSection = Field(default_factory=InferenceSection)
    opponent_policies: list[OpponentPolicy] = Field(default_factory=list)
    """Served, never-trained opponents (frozen checkpoints, larger models) that ``rollout.opponents`` names."""
    curriculum: CurriculumSection | None = None
    """Service mode: configures the stack's curriculum service for this run (see ``CurriculumSection``)."""

    @model_validator(mode="after")
    def _check_names(self) -> TrainConfig:
        check_config(self)
        return self

    @property
    def warm_started(self) -> bool:
        """A warm start runs before RL (a ``warmstart`` section with ``steps`` > 0)."""
        return self.warmstart is not None and self.warmstart.steps > 0

    @property
    def eval_base(self) -> bool:
        """The base models are evaluated (``eval.base``; by default when ``warm_started``)."""
        return self.warm_started if self.eval.base is None else self.eval.base

    @property
    def base_beside_training(self) -> bool:
        """The base models' evaluation plays beside training (``eval.base_overlap`` where it applies: a base
        to evaluate, service mode)."""
        return self.eval.base_overlap and self.eval_base and self.rollout.mode == "service"

    def algo_config(self) -> AlgoConfig:
        out: AlgoConfig = _build(AlgoConfig, self.algo, "algo")
        return out

    def loss_config(self) -> LossConfig:
        out: LossConfig = _build(LossConfig, self.loss, "loss")
        return out

    def batch_config(self, pad_token_id: int = 0) -> BatchConfig:
        kw = dict(self.batch)
        for key in ("group_by", "policies", "skip_actions"):
            if key in kw:
                kw[key] = tuple(kw[key])
        out: BatchConfig = _build(BatchConfig, {**kw, "pad_token_id": pad_token_id}, "batch")
        return out

    def learner_config(
        self, policy: PolicySection, cache_dir: str, model: str | None = None
    ) -> LearnerConfig:
        return LearnerConfig(
            model=model or policy.model,
            cache_dir=cache_dir,
            lora_rank=policy.lora_rank,
            lora_alpha=policy.lora_alpha,
            lora_target_modules=tuple(policy.lora_target_modules),
            lr=policy.lr,
            max_grad_norm=policy.max_grad_norm,
            ppo_epochs=policy.ppo_epochs,
            mini_batch_size=policy.mini_batch_size,
            micro_batch_size=policy.micro_batch_size,
            target_kl=policy.target_kl,
            temperature=self.rollout.temperature if self.rollout.temperature > 0 else 1.0,
            value_head=policy.value_head,
            device=policy.device,
            seed=self.seed,
            loss=self.loss_config(),
            extra=policy.extra,
        )


CAPABILITIES: dict[str, str] = {
    "lora": "lora_rank > 0 (LoRA adapters)",
    "value_head": "value_head: true (a value head, for GAE)",
    "generate": "rollout.mode local (sampling in process with the learner's own weights)",
    "target_kl": "target_kl > 0 (stopping an update early on the policy's KL)",
}
"""What a learner may support beyond full-weight policy-gradient updates (its class's ``capabilities``),
and the config setting that needs it. ``check_config`` refuses a setting whose capability the policy's
learner lacks, at load time, so ``--check`` fails where construction would."""


def learner_capabilities(name: str) -> frozenset[str]:
    """The ``capabilities`` of the learner registered as ``name`` (its module imports without verl)."""
    from wolfpack_trainer.learners.base import UnknownLearnerError, get_learner

    try:
        cls = get_learner(name)
    except UnknownLearnerError as exc:
        raise ValueError(str(exc.args[0])) from None
    return frozenset(getattr(cls, "capabilities", frozenset()))


def game_options(cfg: TrainConfig) -> dict[str, Any]:
    """``game.options`` plus the language, as the engine's ``reset`` takes them (what the environment
    service builds from a ``CreateEpisodeRequest``; "en" is every game's default and is left out)."""
    options = dict(cfg.game.options)
    if cfg.game.language and cfg.game.language != "en":
        options["language"] = cfg.game.language
    return options


def start_game(cfg: TrainConfig, seed: int) -> Any:
    """A started engine of the config's game, variant and options at ``seed`` (roles dealt)."""
    from wolfpack_games import make_game

    env = make_game(cfg.game.id, cfg.game.variant)
    env.start(seed=seed, options=game_options(cfg))
    return env


def check_config(cfg: TrainConfig) -> None:
    """Everything a run needs that can be known without weights: names resolve, learners support what
    their policy asks, every seat, role, bot and opponent exists, and no section is silently unread.
    Raises ``ValueError`` naming the key."""
    from wolfpack_games import get_game
    from wolfpack_trainer.algos import get_estimator

    spec = get_game(cfg.game.id)
    variant = cfg.game.variant or spec.default_variant
    if variant not in spec.variants:
        raise ValueError(f"game {cfg.game.id} has no variant {variant!r}: {', '.join(spec.variants)}")
    try:
        env = start_game(cfg, cfg.seed)
    except Exception as exc:  # engines raise Key/Value/Type errors for bad option values
        raise ValueError(
            f"game.options/language: cannot start {cfg.game.id}/{variant} with {game_options(cfg)}: {exc}"
        ) from None
    n_seats = len(env.possible_agents)
    dealt = sorted({env.role(s) for s in env.possible_agents})
    bots = ", ".join(sorted(spec.bots))
    if cfg.game.bot not in spec.bots:
        raise ValueError(f"game.bot: {cfg.game.id} has no bot {cfg.game.bot!r}; bots: {bots}")
    local = cfg.rollout.mode == "local"

    if not cfg.policies:
        raise ValueError("at least one policy must be trained")
    ids = [p.id for p in cfg.policies]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate policy ids: {ids}")
    estimator = cfg.algo_config().estimator
    get_estimator(estimator)
    taken: dict[int, str] = {}
    role_of: dict[str, str] = {}
    for p in cfg.policies:
        caps = learner_capabilities(p.learner)
        needs = {
            "lora": p.lora_rank > 0,
            "value_head": p.value_head,
            "generate": local,
            "target_kl": p.target_kl > 0,
        }
        for cap, needed in needs.items():
            if needed and cap not in caps:
                have = ", ".join(sorted(caps)) or "none of " + ", ".join(CAPABILITIES)
                raise ValueError(
                    f"policy {p.id}: learner {p.learner!r} does not support {CAPABILITIES[cap]} "
                    f"(it supports: {have})"
                )
        if p.device.strip().lower() not in ("", "auto", "cpu", "cuda") and not p.device.startswith("cuda:"):
            raise ValueError(f"policy {p.id}: device {p.device!r}: expected auto, cpu or cuda[:n]")
        if estimator == "gae" and not p.value_head:
            raise ValueError(f"policy {p.id}: algo.estimator gae needs value_head: true (V(s) for GAE)")
        if not p.seats and not p.roles:
            raise ValueError(f"policy {p.id}: give seats or roles")
        for seat in p.seats:
            if not 0 <= seat < n_seats:
                raise ValueError(
                    f"policy {p.id}: seat {seat} out of range ({cfg.game.id}/{variant} has {n_seats})"
                )
            if seat in taken:
                raise ValueError(f"policy {p.id}: seat {seat} is already policy {taken[seat]}'s")
            taken[seat] = p.id
        for role in p.roles:
            if role not in dealt:
                raise ValueError(
                    f"policy {p.id}: role {role!r} is not dealt in {cfg.game.id}/{variant} with these "
                    f"game.options; roles: {', '.join(dealt)}"
                )
            if role in role_of:
                raise ValueError(f"policy {p.id}: role {role!r} is already policy {role_of[role]}'s")
            role_of[role] = p.id
    if unknown := sorted(set(cfg.eval.replaces) - set(ids)):
        raise ValueError(f"eval.replaces {unknown}: no such trained policy ({', '.join(ids)})")
    if set(cfg.eval.replaces) >= set(ids):
        raise ValueError("eval.replaces: every trained policy replaced, so the evaluation measures nothing")
    if cfg.eval.vs_bot and len(ids) < 2:
        raise ValueError(
            "eval.vs_bot: needs two or more trained policies (one is already scored against the bot)"
        )
    if cfg.eval.vs_bot and cfg.eval.replaces:
        raise ValueError(
            "eval.vs_bot with eval.replaces: vs_bot already gives the other policies' seats to the bot, one "
            "policy at a time; use one of them"
        )
    eval_role_of: dict[str, str] = {}
    for pid, eval_roles in cfg.eval.roles.items():
        policy = next((p for p in cfg.policies if p.id == pid), None)
        if policy is None:
            raise ValueError(f"eval.roles: no trained policy {pid!r}; policies: {', '.join(ids)}")
        if not policy.roles or not eval_roles:
            raise ValueError(
                f"eval.roles.{pid}: give roles for a policy that trains by roles (it trains "
                f"{'roles ' + ', '.join(policy.roles) if policy.roles else 'seats'})"
            )
        for role in eval_roles:
            if role not in dealt:
                raise ValueError(f"eval.roles.{pid}: role {role!r} is not dealt; roles: {', '.join(dealt)}")
    from wolfpack_trainer.evaluate import eval_role_pairs

    for role, pid in eval_role_pairs(cfg, cfg.policies):
        if role in eval_role_of:
            raise ValueError(f"eval.roles: role {role!r} is both policy {eval_role_of[role]}'s and {pid}'s")
        eval_role_of[role] = pid
    if cfg.train.share_policy and len(cfg.policies) > 1:
        first = cfg.policies[0].model_dump(exclude={"id", "seats", "roles"})
        for p in cfg.policies[1:]:
            if p.model_dump(exclude={"id", "seats", "roles"}) != first:
                raise ValueError(
                    f"train.share_policy: policy {p.id} differs from {cfg.policies[0].id} in its learner "
                    "settings, which one shared learner would not read; make them equal or share_policy: false"
                )
    cfg.loss_config()
    cfg.batch_config()

    served = {o.id: o for o in cfg.opponent_policies}
    if len(served) != len(cfg.opponent_policies) or set(served) & set(ids):
        raise ValueError("opponent_policies: ids must be unique and differ from the trained policies' ids")
    used = set()
    for mix in cfg.rollout.opponents:
        if mix.bot and mix.bot not in spec.bots:
            raise ValueError(
                f"rollout.opponents: {cfg.game.id} has no bot {mix.bot!r}; bots: {bots}. A strong opponent "
                "is a policy served by inference: declare it in opponent_policies and use {policy: <id>}"
            )
        if mix.policy:
            if mix.policy not in served:
                raise ValueError(
                    f"rollout.opponents: policy {mix.policy!r} is not in opponent_policies "
                    f"({', '.join(served) or 'none declared'})"
                )
            used.add(mix.policy)
    if unused := sorted(set(served) - used):
        raise ValueError(f"opponent_policies {unused}: no rollout.opponents entry plays them")
    if served and local:
        raise ValueError("opponent_policies are served by inference: they need rollout.mode service")
    if sum(m.fraction for m in cfg.rollout.opponents) > 1.0 + 1e-9:
        raise ValueError("opponent mix fractions sum to more than 1")
    for mix in cfg.rollout.opponents:
        if unknown := sorted(set(mix.replaces) - set(ids)):
            raise ValueError(
                f"rollout.opponents: replaces {unknown}: no such trained policy ({', '.join(ids)})"
            )
        if set(mix.replaces) >= set(ids):
            raise ValueError("rollout.opponents: replaces every trained policy, so its groups train nothing")
        for role in mix.roles:
            if role not in dealt:
                raise ValueError(
                    f"rollout.opponents: role {role!r} is not dealt in {cfg.game.id}/{variant} with these "
                    f"game.options; roles: {', '.join(dealt)}"
                )
            owner = role_of.get(role)
            if owner is not None and owner not in mix.replaces:
                raise ValueError(
                    f"rollout.opponents: role {role!r} is policy {owner}'s, so no untrained seat has it "
                    f"(give replaces: [{owner}] to hand that policy's seats to the entry)"
                )
    trained = set(taken) | {s for s in env.possible_agents if env.role(s) in role_of}
    if any(not m.replaces for m in cfg.rollout.opponents) and len(trained) == n_seats:
        raise ValueError(
            "rollout.opponents: the trained policies take every seat, so no opponent would ever play; "
            "give the entry replaces: [<policy id>] to hand that policy's seats to it in its groups"
        )
    if cfg.rollout.episodes_per_update % cfg.rollout.group_size:
        raise ValueError("rollout.episodes_per_update must be a multiple of rollout.group_size")
    if local:
        unread = {
            "curriculum": cfg.curriculum is not None,
            "inference": cfg.inference != InferenceSection(),
        }
        for key, set_ in unread.items():
            if set_:
                raise ValueError(
                    f"{key}: applies only with rollout.mode service (the services' stack); local mode "
                    "would ignore it"
                )
    _check_reward_spec(cfg)

    # A warm start goes with LoRA in either mode: in service mode the job warm-starts before its stack
    # starts, which serves the clone as the base the adapters are pushed onto (cli.serve_base).
    ws = cfg.warmstart
    if ws is not None and ws.steps > 0 and ws.bot not in spec.bots:
        raise ValueError(f"warmstart.bot: {cfg.game.id} has no bot {ws.bot!r}; bots: {bots}")
    if cfg.eval.base and not cfg.warm_started:
        raise ValueError(
            "eval.base: without a warm start the base model is the update-0 policy, which the run already "
            "evaluates (reference: initial); remove the key or configure a warmstart"
        )
    if cfg.eval_base:
        from wolfpack_trainer.evaluate import base_policy_ids

        clash = sorted(set(base_policy_ids(cfg).values()) & (set(ids) | set(served)))
        if clash:
            raise ValueError(
                f"eval.base: the base models are served as {', '.join(clash)}, which a policy of the config "
                "already uses; rename that policy or set eval.base: false"
            )


def _check_reward_spec(cfg: TrainConfig) -> None:
    """``rollout.reward_spec`` (empty: the game's default) names a spec of the reward library for this game,
    the one the reward service (service mode) and local play score with, and ``rollout.invalid_penalty``,
    when given, is that spec's penalty."""
    try:
        from wolfpack_rewards import resolve_spec
    except ModuleNotFoundError as exc:  # a build without the reward library: the service checks it
        if exc.name and exc.name.startswith("wolfpack_rewards"):
            return
        raise
    try:
        spec = resolve_spec(cfg.rollout.reward_spec, cfg.game.id)
    except Exception as exc:  # the registry's miss error lists the valid names
        raise ValueError(f"rollout.reward_spec: {exc}") from None
    penalty = cfg.rollout.invalid_penalty
    if penalty is not None and penalty != spec.config.penalties.invalid:
        raise ValueError(
            f"rollout.invalid_penalty: {penalty} differs from reward spec {spec.key}'s "
            f"{spec.config.penalties.invalid}, which is what scores; name a spec with that penalty instead"
        )


def _build(cls: Any, values: dict[str, Any], section: str) -> Any:
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{section}: unknown keys {unknown}; known: {sorted(known)}")
    return cls(**values)


class ConfigError(Exception):
    pass


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``key.path=value`` items (``train.updates=2``, ``policies.0.lr=1e-4``) applied to a copy of the
    config's data; values are YAML (``2`` an int, ``[a, b]`` a list, ``null``). A new key is set as given
    and then meets the same strict validation as the file (an unknown key is an error)."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected key.path=value")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: the value is not YAML: {exc}") from None
        *parents, leaf = key.strip().split(".")
        node: Any = out
        walked: list[str] = []
        for part in parents:
            walked.append(part)
            if isinstance(node, dict):
                node = node.setdefault(part, {})
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise ConfigError(f"override {item!r}: {'.'.join(walked)} is not a section or list index")
        if isinstance(node, dict):
            node[leaf] = value
        elif isinstance(node, list) and leaf.isdigit() and int(leaf) < len(node):
            node[int(leaf)] = value
        else:
            raise ConfigError(f"override {item!r}: {'.'.join(parents) or key} is not a section or list index")
    return out


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a key given twice in one mapping. Why: YAML keeps the last one
    silently, so an edit of the first does nothing (``gpu-ippo-smollm2.yaml`` carried two ``eval`` sections
    until session 23, and a change to the first was lost). Merge keys (``<<: *anchor``) may still be
    overridden by the mapping's own keys, as YAML intends."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        if not isinstance(key, Hashable):
            continue  # construct_yaml_map refuses it with its own error
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found the key {key!r} twice (first on line {seen[key] + 1})", key_node.start_mark,
            )  # fmt: skip
        seen[key] = key_node.start_mark.line
    return (yield from loader.construct_yaml_map(node))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read and validate a YAML config, with ``key=value`` overrides on top; errors name the file and the
    field (a key given twice in one section is an error: ``_StrictLoader``)."""
    p = Path(path)
    try:
        data = yaml.load(p.read_text(), Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a training config is a mapping with name, game and policies sections")
    data = apply_overrides(data, overrides)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{p}: {_readable(exc)}") from None
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{p}: {exc}") from None


def _readable(exc: ValidationError) -> str:
    """pydantic's errors as ``key.path: message`` lines (no input dumps, no documentation links)."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}: {msg}" if where else msg)
    return "\n".join(lines)
