"""The learning signal, measured on the demo's own task and config: GRPO on the ultimatum responder with an
outside option (``variant: outside``: the offer lies on either side of the option, so every constant
answer wins about half the games and only reading both numbers wins them all), tiny model, from a clone
of the random bot. After training, the held-out win rate's 95% CI lies above every constant policy and
the random bot measured on the same seeds (``evaluate.references``) — the claim ``make demo`` prints.

RL on a tiny model is not the same every time, so the local run (``configs/demo-ultimatum-local.yaml``:
the rollout driver over in-process backends) trains three seeds and asserts the claim for at least two.
Service mode (``configs/demo-ultimatum.yaml``: the same driver through real environment, inference and
reward servers, weights pushed every update) is checked for what makes it the same run: it plays the
held-out seeds through the served policy, version by version, with the references beside it, and the
trainee sees the same prompt ids as in process (the last 64 tokens, sent as a token prompt). Its own
learning claim is tested too, on seed 0 (the run ``make demo`` makes, one seed: a service run is slower and
its episodes finish in the order the servers answer, so it is not bit-reproducible, and each run is a fresh
draw): it held in 22 of 23 runs (its docstring says what used to break it). Real Redis stream, real verl
estimator and loss, real tiny model."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack_environment.server import EnvironmentServicer
from wolfpack_environment.server import register as register_environment
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.models import tiny_model
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import InferenceServicer
from wolfpack_inference.server import register as register_inference
from wolfpack_reward.server import register as register_reward
from wolfpack_rollout.client import Addresses, connect
from wolfpack_trainer.config import TrainConfig, load_config
from wolfpack_trainer.evaluate import references
from wolfpack_trainer.local_rollout import Generated, local_driver, prompt_encoder, rollout_config
from wolfpack_trainer.publish import Publisher
from wolfpack_trainer.train import (
    EvalResult,
    Trainer,
    _run_serving,
    learning_line,
    plan_tasks,
    run_training,
    service_task,
)

ROOT = Path(__file__).resolve().parents[1]
LOCAL_SEEDS, LOCAL_NEEDED = (0, 1, 2), 2


def _config(name: str, seed: int, stream: str, model: str) -> TrainConfig:
    """The demo config with this test's seed, stream and model path (nothing else changed)."""
    data = load_config(ROOT / "configs" / name).model_dump()
    data["seed"] = seed
    data["stream"]["name"] = stream
    for p in data["policies"]:
        p["model"] = model
    data["train"]["save_versions"] = False
    return TrainConfig.model_validate(data)


def _holds(cfg: TrainConfig, evals: list[EvalResult]) -> tuple[bool, str]:
    """Whether the final CI lies above every constant and the random bot, and the lines that say so."""
    final = evals[-1].win_rate
    refs = [r for r in references(cfg) if r.name.startswith("constant:") or r.name == "random"]
    assert {r.name for r in refs} == {"constant:ACCEPT", "constant:REJECT", "random"}
    line = learning_line("win_rate", evals[0], evals[-1])
    shown = ", ".join(f"{r.name} {r.win_rate.mean:.2f}" for r in refs)
    return all(final.lo > r.win_rate.mean for r in refs), f"seed {cfg.seed}: {line}; references {shown}"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model cache for the module: the tiny model and its warm-start clone are built once."""
    return tmp_path_factory.mktemp("models")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_demo_learns_the_outside_option_in_process(redis_url: str, tmp_path: Path, models: Path) -> None:
    tiny = str(tiny_model(models))
    report = []
    held = 0
    for seed in LOCAL_SEEDS:
        cfg = _config("demo-ultimatum-local.yaml", seed, f"test:learning:{tmp_path.name}:{seed}", tiny)
        trainer, evals = run_training(cfg, tmp_path / f"run{seed}", redis_url, models)
        assert trainer.state.step == cfg.train.updates and evals[-1].step == cfg.train.updates
        assert evals[0].win_rate.n == evals[-1].win_rate.n == cfg.eval.episodes
        ok, line = _holds(cfg, evals)
        held += ok
        report.append(line)
    print("\n".join(report))
    assert held >= LOCAL_NEEDED, "\n".join(report)


@contextlib.asynccontextmanager
async def _stack(
    models: Path, redis_url: str, stream: str, policy_ids: tuple[str, ...] = ("responder",)
) -> AsyncIterator[Addresses]:
    """Environment, inference (serving the tiny model as each of ``policy_ids``, version 0) and reward
    servers in process: a fresh stack per training run, so each starts from inference's version 0."""
    settings = load_settings(rpc_timeout_s=60)
    configs = [
        PolicyConfig(
            policy_id=pid, model=str(tiny_model(models)), device="cpu", dtype="float32", max_batch=64
        )  # type: ignore[arg-type]
        for pid in policy_ids
    ]
    registry = PolicyRegistry.from_configs(configs, models / f"inference-{stream.rsplit(':', 1)[-1]}")
    env = await rpc.start_server(
        "environment", lambda s: register_environment(s, EnvironmentServicer()), settings, "127.0.0.1:0"
    )
    servicer = InferenceServicer(registry)
    inf = await rpc.start_server(
        "inference", lambda s: register_inference(s, servicer), settings, "127.0.0.1:0"
    )
    rew = await rpc.start_server("reward", register_reward, settings, "127.0.0.1:0")
    try:
        yield Addresses(
            f"127.0.0.1:{env.port}", f"127.0.0.1:{inf.port}", f"127.0.0.1:{rew.port}", None, redis_url, stream
        )
    finally:
        for server in (env, inf, rew):
            await server.stop(0)
        await registry.close()


async def _train_through_services(
    cfg: TrainConfig, models: Path, redis_url: str, stream: str, tmp_path: Path, concurrency: int
) -> tuple[Trainer, list[Any]]:
    """``cfg`` trained the way ``wolfpack train`` runs service mode: real environment, inference and reward
    servers, the driver ``wolfpack train`` builds, the weights pushed to inference after every update."""
    settings = load_settings(rpc_timeout_s=60)
    rollout = rollout_config(cfg, concurrency=concurrency)  # what `wolfpack train` gives the driver
    ids = tuple(p.id for p in cfg.policies)
    async with _stack(models, redis_url, stream, ids) as addresses:

        def driver() -> Any:
            return connect(settings, rollout, addresses, stream=False)

        trainer = Trainer(cfg, tmp_path / "run", redis_url, cache_dir=models)
        trainer.publisher = Publisher(
            tmp_path / "policies", settings, inference_addr=addresses.inference, save_dirs=False
        )
        trainer.setup()
        evals = await _run_serving(trainer, None, None, driver)
    return trainer, list(evals)


@pytest.mark.slow
async def test_service_mode_evaluates_the_served_policy_beside_the_references(
    redis_url: str, tmp_path: Path, models: Path
) -> None:
    tiny = str(tiny_model(models))
    stream = f"test:learning-service:{tmp_path.name}"
    cfg = _config("demo-ultimatum.yaml", 0, stream, tiny)
    data = cfg.model_dump()
    data["warmstart"] = None  # the evaluation path, not the clone, is under test here
    data["rollout"].update(episodes_per_update=8)
    data["train"].update(updates=2, checkpoint_every=1)
    data["eval"].update(every=1, episodes=8)
    cfg = TrainConfig.model_validate(data)
    trainer, evals = await _train_through_services(cfg, models, redis_url, stream, tmp_path, concurrency=8)
    assert [e.step for e in evals] == [0, 1, 2] and all(e.win_rate.n == 8 for e in evals)
    rows = trainer.metrics.rows()
    # each evaluation played the version inference served at the time: the start (1), then one per update
    assert [r["eval/policy_version"] for r in rows if "eval/policy_version" in r] == [1, 2, 3]
    served = {(t.policy.policy_id, t.policy.version) for tr in evals[-1].trajectories for t in tr.turns}
    assert served - {("", 0)} == {("responder", 3)}, served  # ("", 0): turns of the scripted proposer
    first = set().union(*(r for r in rows if r["step"] == 0))  # what the run logged before its first update
    assert {"reference/constant_ACCEPT/win_rate", "reference/random/win_rate", "perf/setup_s"} <= first
    trainee = [t for tr in evals[-1].trajectories for t in tr.turns if t.policy.policy_id]
    assert trainee and all(len(t.prompt_token_ids) == cfg.rollout.max_prompt_tokens for t in trainee)


@pytest.mark.slow
async def test_service_mode_scores_each_co_trained_policy_against_the_bot(
    redis_url: str, tmp_path: Path, models: Path, held_out_plans: list[list[str]]
) -> None:
    """``eval.vs_bot`` through the services: the IPPO config's evaluation plays the pair, then the proposer
    alone and the responder alone, each with the heuristic bot in the other seat (the held-out plans it
    asked for), every game through the served policies."""
    tiny = str(tiny_model(models))
    stream = f"test:vs-bot-service:{tmp_path.name}"
    data = load_config(ROOT / "configs" / "ippo-ultimatum.yaml").model_dump()
    data["warmstart"] = None
    data["stream"]["name"] = stream
    data["rollout"].update(mode="service", episodes_per_update=8)
    for p in data["policies"]:
        p["model"] = tiny
    data["train"].update(updates=0, save_versions=False)
    data["eval"].update(episodes=8, vs_bot=True)
    cfg = TrainConfig.model_validate(data)
    trainer, evals = await _train_through_services(cfg, models, redis_url, stream, tmp_path, concurrency=8)
    assert [e.step for e in evals] == [0] and held_out_plans == [[], ["responder"], ["proposer"]]
    assert set(evals[0].vs_bot) == {"proposer", "responder"}
    assert all(s.reward.n == 8 and s.win_rate.n == 8 for s in evals[0].vs_bot.values())
    first = set().union(*(r for r in trainer.metrics.rows() if r["step"] == 0))
    assert {"eval_vs_bot/proposer/reward_mean", "reference_vs_bot/responder/heuristic/win_rate"} <= first
    assert evals[0].failed == 0


@pytest.mark.slow
@pytest.mark.unreliable
@pytest.mark.timeout(1800)
async def test_demo_learns_the_outside_option_through_the_services(
    redis_url: str, tmp_path: Path, models: Path
) -> None:
    """``make demo``'s own run (configs/demo-ultimatum.yaml, seed 0, warm start and all 20 updates) through
    real environment, inference and reward servers, the weights pushed to inference every update; only the
    evaluation at update 10 is left out (``eval.every`` 20: the first and last evaluations are the claim).
    The claim asserted is ``make demo``'s: the final CI's lower bound above every constant
    (``constant:ACCEPT`` 0.59 is the larger) and the random bot (0.52), and above the initial policy.

    A service run is not bit-reproducible (episodes finish in the order the servers answer), so each run is
    a fresh draw of the recipe, and the test holds as often as the recipe does. It used to miss 3 runs in 10
    (lr 1e-3, 2026-11-26), and the cause was not the service path (measured 2026-11-27): the seeds are
    varied (32 fresh ones an update, 4 episodes each) and only 12 scenarios exist (option 4..6, gap 1..2,
    side), each met ~50 times in training; evaluation plays the pushed version (21) at training's
    temperature with the same 64-token prompts; the sampler's logprobs match the learner's to 1e-5. A failed
    run's *training* episodes fail too: one update breaks the tiny model's letter-by-letter spelling of its
    answer (``REJEPT``, ``ACCECT``: the shared ``..E?T`` suffix, pushed one way in one context, leaks into the
    other), a misspelt answer is a message, not a decision, and once it is deterministic every episode of a
    group ends alike, so GRPO's advantages are 0 and nothing repairs it (``grad_norm`` 0 from then on). A
    break in the last update alone leaves the training episodes (of the versions before it) at ~0.9 and the
    evaluated version at ~0.5: the 0.49 run of 2026-11-26. Local mode breaks the same way (3 of 6 seeds at
    lr 1e-3 over 20 updates, all recovered); its test runs fixed, reproducible seeds. The recipe now (lr 3e-4,
    ``target_kl`` 0.2) breaks a sixth as often as lr 1e-3 (configs/README.md) and passed 22 of 22 runs here
    (one at a time, 40-50 s each on 2 shared cores; finals 0.70-0.95), then broke once (0.49 -> 0.42, a CI
    run of 2026-11-27 beside CPU benchmarks), passed the next fresh-clone CI runs (three of session 24, two of
    session 25) and broke again in the third of session 25 (0.43 -> 0.41, 95% CI 0.33..0.50, at ``e504dd4``,
    nothing else running). So: ~2 misses in ~30 runs, and out of CI as ``unreliable`` (the project's rule for a
    claim that holds in most runs but not all): ``pytest -m unreliable tests/test_train_learning.py``. The
    local-mode seeds above (fixed, reproducible) stay in CI."""
    tiny = str(tiny_model(models))
    stream = f"test:learning-demo-service:{tmp_path.name}"
    data = _config("demo-ultimatum.yaml", 0, stream, tiny).model_dump()
    data["eval"]["every"] = data["train"]["updates"]
    cfg = TrainConfig.model_validate(data)
    # setup() makes the warm-start clone (cached in the module's model cache)
    _, evals = await _train_through_services(cfg, models, redis_url, stream, tmp_path, concurrency=64)
    assert [e.step for e in evals] == [0, cfg.train.updates]
    assert all(e.win_rate.n == cfg.eval.episodes for e in evals)
    ok, line = _holds(cfg, evals)
    print(line)
    assert ok, line
    assert evals[-1].win_rate.lo > evals[0].win_rate.mean, line


async def test_local_and_service_mode_send_the_same_prompts(
    redis_url: str, tmp_path: Path, models: Path
) -> None:
    """The demo's episodes through the services (real environment, inference and reward servers; the driver
    crops with the trainer's tokenizer and sends token prompts) and in process (the same driver over the
    in-process backends) give the trainee the same prompt ids, cropped to ``rollout.max_prompt_tokens``:
    before, inference compressed a whole prompt over the tiny model's budget by cutting its middle out while
    local mode read the tail, so the two modes trained on different inputs."""
    from transformers import AutoTokenizer

    tiny = str(tiny_model(models))
    settings = load_settings(rpc_timeout_s=60)
    cfg = _config("demo-ultimatum.yaml", 0, f"test:prompts:{tmp_path.name}", tiny)
    assert cfg.rollout.max_prompt_tokens == 64
    rollout = rollout_config(cfg, concurrency=8, temperature=0.0)
    tasks = [service_task(t, i) for i, t in enumerate(plan_tasks(cfg, range(8), 1, "eval", False))]
    tokenizer = AutoTokenizer.from_pretrained(tiny)

    def first_prompts(trajs: list[Any]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for tr in trajs:
            trainee = [t for t in tr.turns if t.policy.policy_id]
            out[tr.seed] = list(trainee[0].prompt_token_ids)
        return out

    async with (
        _stack(models, redis_url, f"test:prompts:{tmp_path.name}") as addresses,
        connect(settings, rollout, addresses, stream=False) as driver,
    ):
        driver.encode_prompt = prompt_encoder(tokenizer)
        served = first_prompts(await driver.play(tasks))

    def answer(policy_id: str, prompts: list[list[int]], sampling: Any) -> list[Generated]:
        return [Generated([int(tokenizer.eos_token_id)], [0.0], 2) for _ in prompts]

    local = first_prompts(
        await local_driver(rollout, tokenizer, answer, lambda: {"responder": 0}).play(tasks)
    )
    assert len(served) == len(local) == 8
    assert served == local
    assert all(len(ids) == 64 for ids in local.values())
