"""Check a stock verl ``main_ppo`` command line without a GPU: compose its Hydra config (verl's own
``ppo_trainer`` defaults plus the overrides), build the actor and critic config dataclasses, run verl's
``validate_config``, and load the training parquet through verl's ``RLHFDataset`` with the composed
``data`` settings, as ``main_ppo`` would before it starts any worker. Catches misspelt keys, keys of the
wrong type, and a dataset whose rows verl drops (e.g. an empty prompt that the over-long filter cannot
template: every row went).

    python bench/trainer/main_ppo_config_check.py <main_ppo overrides ...>

Model paths that do not exist here (the GPU host's checkpoints) are replaced by the tiny random Qwen2
(``wolfpack_inference.models.tiny_model``, ChatML like SmolLM2), since verl opens the model's config and
tokenizer while building its configs; everything else is checked as given.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path")


def main(overrides: list[str]) -> None:
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo import validate_config
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass

    tiny = ""
    fixed = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+") in MODEL_KEYS and not Path(value).exists():
            if not tiny:
                from wolfpack_inference.models import tiny_model

                tiny = str(tiny_model(Path(tempfile.gettempdir()) / "main-ppo-check-models"))
            print(f"{key}: {value} is not here; checking with the tiny model {tiny}")
            value = tiny
        fixed.append(f"{key}={value}")
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=fixed)
    OmegaConf.resolve(cfg)
    critic, ref = need_critic(cfg), need_reference_policy(cfg)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    print(f"adv_estimator {cfg.algorithm.adv_estimator}: critic {critic}, reference policy {ref}")
    print(f"algorithm gamma {cfg.algorithm.gamma}, lam {cfg.algorithm.lam}")
    print(f"actor checkpoint save_contents {list(actor.checkpoint.save_contents)}")
    if critic:
        crit = omega_conf_to_dataclass(cfg.critic)
        print(f"critic checkpoint save_contents {list(crit.checkpoint.save_contents)}, lr {crit.optim.lr}")
    validate_config(config=cfg, use_reference_policy=ref, use_critic=critic)
    check_micro_batches(cfg, critic)

    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    files = cfg.data.train_files
    dataset = RLHFDataset(
        data_files=list(files) if not isinstance(files, str) else [files],
        tokenizer=tokenizer,
        config=cfg.data,
    )
    if len(dataset) == 0:
        raise SystemExit("verl's RLHFDataset kept no row of the training data")
    print(f"training rows verl keeps: {len(dataset)}; first row's raw_prompt {dataset[0]['raw_prompt']!r}")
    print("main_ppo config check: ok")


def check_micro_batches(cfg: Any, critic: bool) -> None:
    """Refuse a per-GPU micro-batch that does not divide its mini-batch.

    verl's ``validate_config`` checks only the global ``ppo_micro_batch_size``; with the per-GPU one its
    engine asserts the division at the first update, after every worker, vLLM and the first rollout (s25's
    agent-loop village died there after ~10 minutes, micro 32 against a mini-batch of 8).
    """
    gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    sections = [("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor)]
    if critic:
        sections.append(("critic", cfg.critic))
    for name, sec in sections:
        micro = sec.get("ppo_micro_batch_size_per_gpu")
        if sec.get("use_dynamic_bsz") or micro is None:
            continue
        mini = sec.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n // gpus
        if mini % micro:
            raise SystemExit(
                f"{name}.ppo_micro_batch_size_per_gpu {micro} does not divide its mini-batch of {mini} "
                f"samples a GPU (ppo_mini_batch_size x rollout.n / GPUs): verl's engine asserts it at the first update"
            )
        print(f"{name}: mini-batch {mini} samples a GPU in micro-batches of {micro}")


if __name__ == "__main__":
    main(sys.argv[1:])
