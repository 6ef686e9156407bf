"""Scenario families, one module each; ``get_family`` is the lookup everything else uses."""

from __future__ import annotations

import importlib

from wolfpack.registry import Registry
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


def _load_families() -> None:
    """Import every family module present and register its ``FAMILY`` (a module not built yet is
    skipped; one that fails to import for another reason is an error)."""
    for name, module_name in FAMILY_MODULES.items():
        try:
            module = importlib.import_module(f"{__name__}.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{module_name}":
                raise
            continue
        family = module.FAMILY
        if not isinstance(family, Family):
            raise TypeError(f"{module.__name__}.FAMILY is not a Family")
        FAMILIES.add(name, family)


FAMILIES: Registry[Family] = Registry("scenario family", loader=_load_families)
"""Family name -> its rules object; the shared ``wolfpack.registry`` shape."""


def get_family(name: str) -> Family:
    """The family's singleton rules object; unknown names (KeyError) list the valid ones."""
    return FAMILIES.get(name)


def available_families() -> list[str]:
    """Families whose module is present, in ``FAMILY_NAMES`` order."""
    return [name for name in FAMILY_NAMES if name in FAMILIES]


__all__ = ["FAMILIES", "FAMILY_NAMES", "Family", "Tracker", "available_families", "get_family"]
