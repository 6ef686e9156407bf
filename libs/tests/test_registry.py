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


def test_key_loader_fills_one_key_and_the_loader_the_rest() -> None:
    loaded: list[str] = []

    def load_all() -> None:
        loaded.append("all")
        reg.add("a", 1)
        reg.add("b", 2)

    def load_a() -> None:
        loaded.append("a")
        reg.add("a", 1)

    reg: Registry[int] = Registry("lazy", loader=load_all, key_loaders={"a": load_a})
    assert reg.get("a") == 1 and loaded == ["a"]  # one key named: only its loader ran
    assert reg.get("b") == 2 and loaded == ["a", "all"]  # another key: the full loader, once
    assert sorted(reg) == ["a", "b"] and loaded == ["a", "all"]

    fresh: Registry[int] = Registry("lazy", loader=load_all, key_loaders={"a": lambda: None})
    reg = fresh  # a key loader that registers nothing falls back to the full loader
    assert reg.get("a") == 1
