"""LoRA adapters that arrive as tensors (PushWeights) instead of a directory: validation and the PEFT
directory each backend loads them from.

Why a directory at all: both engines already load adapters from a PEFT directory (transformers through
``peft.PeftModel.from_pretrained``, vLLM through a ``LoRARequest`` path), so a pushed adapter is written
as one (``adapter_config.json`` + ``adapter_model.safetensors``) and goes through exactly the path of
``LoadPolicy(adapter_path=...)``; there is no second loader to keep in step.

Why validate here, before any engine sees the tensors: peft and vLLM report a malformed adapter late and
obscurely (a missing config key, a size mismatch deep in ``load_state_dict``, or worse, silently random
weights for modules the push forgot when the config says ``init_lora_weights: false``). Everything that can
be checked from the config and the tensors alone is checked here and answered with INVALID_ARGUMENT and a
message that says what to fix; the backend then checks what needs the base model (module names, shapes).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wolfpack_inference.backends.base import ErrorCode, InferenceError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.(?P<kind>lora_A\.weight|lora_B\.weight|lora_embedding_A|lora_embedding_B)$")  # fmt: skip
"""PEFT state-dict keys of a LoRA (adapter name removed, as ``get_peft_model_state_dict`` returns them and
as both ``PeftModel.from_pretrained`` and vLLM read them from ``adapter_model.safetensors``)."""

_UNSUPPORTED = {
    "use_dora": "DoRA adapters",
    "lora_bias": "LoRA biases (lora_bias)",
    "modules_to_save": "full modules next to the adapter (modules_to_save)",
    "trainable_token_indices": "trainable token rows (trainable_token_indices)",
    "layer_replication": "layer replication",
}
"""Config options whose extra tensors or semantics vLLM does not load: refused for both backends, so a policy
behaves the same whichever engine serves it."""


def _bad(msg: str) -> InferenceError:
    return InferenceError(ErrorCode.INVALID_ARGUMENT, msg)


def parse_config(config_json: str) -> dict[str, Any]:
    """The adapter config as a dict, checked for what a LoRA needs (``peft_type`` LORA, ``r`` > 0,
    ``target_modules``) and for options this service cannot serve."""
    if not config_json.strip():
        raise _bad("adapter_config_json is required on the first chunk when is_adapter is set")
    try:
        cfg = json.loads(config_json)
    except json.JSONDecodeError as exc:
        raise _bad(f"adapter_config_json is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise _bad("adapter_config_json must be a JSON object (the adapter's adapter_config.json)")
    if str(cfg.get("peft_type", "")).upper() != "LORA":
        raise _bad(
            f"only LoRA adapters can be pushed: peft_type must be 'LORA', got {cfg.get('peft_type')!r}"
        )
    r = cfg.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise _bad(f"adapter config: r must be a positive integer, got {r!r}")
    targets = cfg.get("target_modules")
    if not targets or not isinstance(targets, str | list):
        raise _bad("adapter config: target_modules is required (a list of module names or a regex)")
    pattern = cfg.get("rank_pattern") or {}
    if not isinstance(pattern, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pattern.values()
    ):
        raise _bad("adapter config: rank_pattern must map module patterns to positive integers")
    for key, what in _UNSUPPORTED.items():
        if cfg.get(key):
            raise _bad(f"adapter config: {what} cannot be served; push a plain LoRA")
    return cfg


def _expected_rank(cfg: Mapping[str, Any], module: str) -> int:
    """``r``, or the ``rank_pattern`` entry matching ``module`` (PEFT's rule: the pattern matches the end of
    the module name at a dot boundary)."""
    for pattern, rank in (cfg.get("rank_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return int(rank)
    return int(cfg["r"])


def check_tensors(cfg: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
    """Every tensor is a LoRA A or B matrix, each module has both, and their rank is the config's."""
    if not tensors:
        raise _bad("an adapter push needs at least one lora_A/lora_B pair")
    bad_names = sorted(k for k in tensors if not _KEY.match(k))
    if bad_names:
        raise _bad(
            f"not LoRA tensor names: {bad_names[:5]}; push PEFT state-dict keys "
            "('base_model.model.<module>.lora_A.weight' / '.lora_B.weight', as get_peft_model_state_dict "
            "returns them, without the adapter name)"
        )
    modules: dict[str, dict[str, Any]] = {}
    for name, t in tensors.items():
        m = _KEY.match(name)
        assert m is not None
        kind = "A" if "_A" in m["kind"] else "B"
        modules.setdefault(m["module"], {})[kind] = t
    for module, pair in sorted(modules.items()):
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise _bad(f"{module}: {missing} is missing (each adapted module needs lora_A and lora_B)")
        a, b = pair["A"], pair["B"]
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise _bad(f"{module}: lora_A and lora_B must be matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}")  # fmt: skip
        rank = _expected_rank(cfg, module)
        if a.shape[0] != rank or b.shape[1] != rank:
            raise _bad(
                f"{module}: rank mismatch: the config says r={rank} but lora_A is {tuple(a.shape)} "
                f"and lora_B is {tuple(b.shape)} (expected [{rank}, in] and [out, {rank}])"
            )


class AdapterDirs:
    """Temporary PEFT directories for pushed adapters, under one root owned by a backend.

    A directory lives as long as some version uses it. Users are counted: ``acquire``/``release`` around
    each use (the current version holds one, each request bound to it another, for engines that read the
    directory lazily), or ``bind`` to tie one use to an object's lifetime (a transformers version whose
    jobs keep it alive). At zero users the directory is deleted; ``close`` removes whatever is left, and so
    does interpreter exit, so a crashed process leaves nothing behind.
    """

    def __init__(self, prefix: str = "wolfpack-adapters-") -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self._lock = threading.Lock()  # releases may come from GC finalizers in the decode thread
        self._users: dict[Path, int] = {}
        self._count = 0
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.root, True)

    def write(self, version: int, cfg: Mapping[str, Any], tensors: Mapping[str, Any]) -> Path:
        """A new directory holding ``cfg`` and ``tensors`` (safetensors), with no users yet: ``acquire`` or
        ``bind`` it once it serves, ``discard`` it when loading it failed."""
        from safetensors.torch import save_file

        with self._lock:
            self._count += 1
            path = self.root / f"v{version}-{self._count}"
        path.mkdir(parents=True)
        try:
            (path / CONFIG_FILE).write_text(json.dumps(dict(cfg), indent=2, sort_keys=True))
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / WEIGHTS_FILE))
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return path

    def owns(self, path: str | Path) -> bool:
        return Path(path).parent == self.root

    def acquire(self, path: str | Path) -> None:
        p = Path(path)
        if self.owns(p):
            with self._lock:
                self._users[p] = self._users.get(p, 0) + 1

    def release(self, path: str | Path) -> None:
        """One use fewer; the directory is deleted with its last use."""
        p = Path(path)
        if not self.owns(p):
            return
        with self._lock:
            left = self._users.get(p, 0) - 1
            if left > 0:
                self._users[p] = left
                return
            self._users.pop(p, None)
        shutil.rmtree(p, ignore_errors=True)

    def bind(self, owner: object, path: str | Path) -> None:
        """One use of ``path`` for as long as ``owner`` lives."""
        if self.owns(path):
            self.acquire(path)
            weakref.finalize(owner, self.release, path)

    def discard(self, path: str | Path) -> None:
        """Delete a directory that never served (its load failed)."""
        if self.owns(path):
            shutil.rmtree(path, ignore_errors=True)

    def live(self) -> list[Path]:
        """Directories not yet deleted (tests check cleanup with it)."""
        return sorted(self.root.iterdir()) if self.root.exists() else []

    def close(self) -> None:
        self._finalizer()
