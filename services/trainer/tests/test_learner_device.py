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


def test_local_verl_workers_pin_their_card_in_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer runs each update in a fresh thread, where the current CUDA device is card 0 again; a
    learner on ``cuda:1`` must set its card on every call (else verl puts the batch on card 0: the split
    layout failed so on a 2-GPU host). A unit test of ``Workers`` alone: the worker is a stand-in and
    ``torch.cuda.set_device`` is recorded, since this machine may have no GPU."""
    import threading

    from wolfpack_trainer.learners.verl.workers import Workers

    pinned: list[tuple[str, int]] = []
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda i: pinned.append((threading.current_thread().name, i))
    )

    class Worker:
        def infer_batch(self, td: object) -> object:
            return td

        def version(self) -> int:
            return 7

    workers = Workers.__new__(Workers)
    workers.ray, workers.world_size, workers.cuda_index = False, 1, 1
    workers.local, workers.groups = {"actor": Worker()}, {}
    results: list[object] = []
    for name, work in (("t-data", lambda: workers.data("actor", "infer_batch", "td")),
                       ("t-call", lambda: workers.call("actor", "version"))):  # fmt: skip
        thread = threading.Thread(target=lambda w=work: results.append(w()), name=name)
        thread.start()
        thread.join()
    assert results == ["td", 7]
    assert pinned == [("t-data", 1), ("t-call", 1)]
    workers.cuda_index = None  # CPU learners and Ray worker groups: nothing to pin
    workers.call("actor", "version")
    assert len(pinned) == 2
