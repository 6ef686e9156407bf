"""Device resolution of the learners: ``auto`` follows the machine, an explicit accelerator that is not
there is an error (never a silent CPU run, the GPU failure mode of the verl learner before)."""

from __future__ import annotations

import pytest
import torch

from wolfpack_trainer.learners.base import DeviceUnavailableError, LearnerConfig, resolve_device


def test_auto_follows_the_machine() -> None:
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("") == resolve_device("auto")
    assert LearnerConfig().device == "auto"


def test_cpu_is_always_cpu() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(" CPU ") == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal; this machine has CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_an_error(device: str) -> None:
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        resolve_device(device)


@pytest.mark.parametrize("device", ["tpu", "gpu", "cuda:x", "mps0"])
def test_unknown_devices_are_refused(device: str) -> None:
    with pytest.raises((DeviceUnavailableError, ValueError)):
        resolve_device(device)


@pytest.mark.gpu
def test_cuda_index_beyond_the_visible_devices_is_an_error() -> None:
    with pytest.raises(DeviceUnavailableError, match="visible"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")
    assert resolve_device("cuda:0") == "cuda:0"


def test_cpu_learner_stays_on_cpu_under_auto_and_refuses_missing_cuda(tmp_path: object) -> None:
    from wolfpack_trainer.learners.cpu import CpuLearner

    learner = CpuLearner(LearnerConfig(model="tiny", cache_dir=str(tmp_path)))
    assert learner.device == "cpu"
    assert next(learner.model.parameters()).device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError):
            CpuLearner(LearnerConfig(model="tiny", cache_dir=str(tmp_path), device="cuda"))
