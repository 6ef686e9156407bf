"""The ``verl_fsdp`` learner over verl's Ray worker groups (``extra.ray_gpus``): FSDP across every visible GPU
of this host (the same code joins a cluster with ``ray_address``). GPU only: CI deselects it; the device runs
``pytest -m gpu services/trainer/tests/test_verl_ray_gpu.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu


def test_ray_worker_groups_train_and_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA GPUs")
    pytest.importorskip("ray")
    import importlib.util

    from wolfpack_inference.models import tiny_model
    from wolfpack_trainer.learners.base import LearnerConfig, LossConfig, get_learner

    spec = importlib.util.spec_from_file_location(
        "test_verl_learner", Path(__file__).with_name("test_verl_learner.py")
    )
    assert spec is not None and spec.loader is not None
    test_verl: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_verl)  # its batch and oracle helpers (importlib mode: no package)
    model_dir = tiny_model(tmp_path / "models")
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    gpus = torch.cuda.device_count()
    learner: Any = get_learner("verl_fsdp")(
        LearnerConfig(
            model=str(model_dir), lr=5e-3, mini_batch_size=4, micro_batch_size=2, device="cuda",
            loss=LossConfig(clip_ratio=0.2), extra={"strategy": "fsdp2", "ray_gpus": gpus},
        )
    )  # fmt: skip
    assert learner.workers.ray and learner.workers.world_size == gpus
    batch = test_verl.make_batch(vocab, seed=1).select(list(range(7)))  # odd count: padded per rank
    ref = test_verl.hf_logprobs(learner.save_pretrained(tmp_path / "now"), batch)
    logp = learner.compute_log_probs(batch)
    assert logp.shape == ref.shape and (logp - ref).abs().max().item() < 0.25
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0])[:, None]
    batch.old_log_probs, batch.advantages = logp, sign * batch.response_mask
    state = learner.state_dict()
    metrics = learner.update(batch)
    assert metrics["perf/learner_gpus"] == gpus and metrics["perf/learner_max_memory_gb"] > 0
    new = learner.compute_log_probs(batch)
    delta = ((new - logp) * batch.response_mask).sum(-1)
    assert delta[0::2].mean() > 0 > delta[1::2].mean()
    learner.load_state_dict(state)
    assert (learner.compute_log_probs(batch) - logp).abs().max().item() < 1e-3


def test_in_process_learner_on_the_second_card_updates_from_a_fresh_thread(tmp_path: Path) -> None:
    """The split layout (vLLM on card 0, ``device: cuda:1`` for the learner) with the trainer's threading:
    each update runs in a new thread, whose current CUDA device is card 0 (2 H200s, before the fix: "Expected
    all tensors to be on the same device, but found at least two devices, cuda:0 and cuda:1")."""
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    import importlib.util
    import threading

    from wolfpack_inference.models import tiny_model
    from wolfpack_trainer.learners.base import LearnerConfig, LossConfig, get_learner

    spec = importlib.util.spec_from_file_location(
        "test_verl_learner", Path(__file__).with_name("test_verl_learner.py")
    )
    assert spec is not None and spec.loader is not None
    test_verl: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_verl)
    model_dir = tiny_model(tmp_path / "models")
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    learner: Any = get_learner("verl_fsdp")(
        LearnerConfig(
            model=str(model_dir), lr=5e-3, mini_batch_size=4, micro_batch_size=2, device="cuda:1",
            loss=LossConfig(clip_ratio=0.2), extra={"strategy": "fsdp2"},
        )
    )  # fmt: skip
    batch = test_verl.make_batch(vocab, seed=1).select(list(range(4)))
    out: dict[str, Any] = {}

    def work() -> None:
        logp = learner.compute_log_probs(batch)
        batch.old_log_probs, batch.advantages = logp, torch.ones_like(logp) * batch.response_mask
        out["metrics"] = learner.update(batch)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "metrics" in out, "the update raised in its thread (see the captured stderr)"
    assert torch.cuda.max_memory_allocated(1) > 0
