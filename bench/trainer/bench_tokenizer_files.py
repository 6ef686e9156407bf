"""What a version directory's tokenizer costs each update: ``AutoTokenizer.from_pretrained`` +
``save_pretrained`` (what both learners' ``save_pretrained`` did every publish) against ``write_tokenizer``
(the files rendered once per model path, then written as bytes), interleaved rounds, same files either way.

    .venv/bin/python bench/trainer/bench_tokenizer_files.py                  # SmolLM2-135M's tokenizer
    .venv/bin/python bench/trainer/bench_tokenizer_files.py --model tiny     # the test model's

On a shared CPU only the ratio means anything.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from wolfpack_trainer.learners.base import _tokenizer_files, write_tokenizer
    from wolfpack_trainer.learners.cpu import resolve_model_path

    with tempfile.TemporaryDirectory(prefix="wolfpack-bench-tokenizer-") as tmp:
        root = Path(tmp)
        model = resolve_model_path(args.model, str(root / "models") if args.cache is None else args.cache)
        times: dict[str, list[float]] = {"load + save_pretrained": [], "write_tokenizer": []}
        _tokenizer_files.cache_clear()
        write_tokenizer(model, Path(tempfile.mkdtemp(dir=root)))  # the one load a run pays
        for r in range(args.rounds):
            for way in list(times) if r % 2 == 0 else list(reversed(times)):
                out = root / f"{way[:4]}{r}"
                out.mkdir()
                t0 = time.perf_counter()
                if way == "write_tokenizer":
                    write_tokenizer(model, out)
                else:
                    AutoTokenizer.from_pretrained(model).save_pretrained(out)
                times[way].append(time.perf_counter() - t0)
        a, b = (root / "load0", root / "writ0")
        same = {f.name: f.read_bytes() for f in a.iterdir()} == {f.name: f.read_bytes() for f in b.iterdir()}
    print(f"\ntokenizer of {args.model}, {args.rounds} rounds; the same files either way: {same}")
    print("| way | s per version (min / median / max) | ratio to load + save_pretrained (medians) |")
    print("| --- | --- | --- |")
    base = statistics.median(times["load + save_pretrained"])
    for way, values in times.items():
        cell = f"{min(values):.4f} / {statistics.median(values):.4f} / {max(values):.4f}"
        print(f"| {way} | {cell} | {statistics.median(values) / base:.3f}x |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model directory")
    ap.add_argument("--cache", default=None, help="model cache directory (default: a temporary one)")
    ap.add_argument("--rounds", type=int, default=20)
    main(ap.parse_args())
