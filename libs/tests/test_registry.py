"""``wolfpack.registry.Registry``: the one shape of games, families, reward specs, inference backends."""

from __future__ import annotations

import pytest

from wolfpack.registry import Registry


def test_register_get_and_the_miss_lists_valid_names() -> None:
    reg: Registry[int] = Registry("thing")

    @reg.register("b")
    def _b() -> int:
        return 2

    reg.add("a", 1)  # type: ignore[arg-type]
    assert reg.get("a") == 1 and reg["b"] is _b and sorted(reg) == ["a", "b"] and "a" in reg
    with pytest.raises(KeyError, match=r"unknown thing 'c'; valid: a, b"):
        reg.get("c")


def test_versions_latest_and_duplicates() -> None:
    reg: Registry[str] = Registry("spec", error=ValueError)
    reg.add("s@1", "one")
    reg.add("s@2", "two")
    reg.add("s@2", "two")  # the same object again: a no-op
    assert reg.get("s") == "two" and reg.get("s@1") == "one"
    with pytest.raises(ValueError, match="already registered"):
        reg.add("s@2", "other")
    with pytest.raises(ValueError, match="integer >= 1"):
        reg.add("s@0", "zero")
    with pytest.raises(ValueError, match="unknown spec 's@3'"):  # the registry's own error type
        reg.get("s@3")


def test_loader_runs_once_on_first_use() -> None:
    calls: list[int] = []

    def load() -> None:
        calls.append(1)
        reg.add("x", 1)

    reg: Registry[int] = Registry("lazy", loader=load)
    assert calls == []
    assert reg.get("x") == 1 and list(reg) == ["x"] and calls == [1]
