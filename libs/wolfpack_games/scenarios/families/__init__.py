"""Scenario families, one module each; ``get_family`` is the lookup everything else uses."""

from __future__ import annotations

import importlib

from wolfpack_games.scenarios.families.base import Family, Tracker

FAMILY_MODULES: dict[str, str] = {
    "bargaining": "bargaining",
    "allocation": "allocation",
    "cooperation": "cooperation",
    "ultimatum": "ultimatum",
    "trust": "trust",
    "public_goods": "public_goods",
    "prisoners_dilemma": "prisoners_dilemma",
    "coalition": "coalition",
}
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILY_MODULES)

_CACHE: dict[str, Family] = {}


def get_family(name: str) -> Family:
    """The family's singleton rules object; unknown names list the valid ones."""
    if name not in _CACHE:
        if name not in FAMILY_MODULES:
            raise KeyError(f"unknown scenario family {name!r}; families: {', '.join(FAMILY_NAMES)}")
        module = importlib.import_module(f"{__name__}.{FAMILY_MODULES[name]}")
        family = module.FAMILY
        if not isinstance(family, Family):
            raise TypeError(f"{module.__name__}.FAMILY is not a Family")
        _CACHE[name] = family
    return _CACHE[name]


def available_families() -> list[str]:
    """Families whose module is present (the others are listed in FAMILY_MODULES but not built yet)."""
    out = []
    for name in FAMILY_NAMES:
        try:
            get_family(name)
        except ModuleNotFoundError as exc:  # only a family module that is absent is skipped
            if exc.name != f"{__name__}.{FAMILY_MODULES[name]}":
                raise
            continue
        out.append(name)
    return out


__all__ = ["FAMILY_NAMES", "Family", "Tracker", "available_families", "get_family"]
