"""One registry shape for every pluggable part: games, scenario families, reward specs, inference backends
and trainer algorithms.

The shape is verl's ``core_algos`` registries, with the weak spot fixed by the caller: a name -> entry
table, a ``register`` decorator (or ``add``), and ``get`` whose miss lists the valid names. Entries of one
registry share one signature (a factory or spec type chosen by its owner), so callers never special-case
an entry. Keys may be versioned as ``name@version``; ``get("name")`` then returns the latest version.

    BACKENDS: Registry[BackendFactory] = Registry("inference backend")

    @BACKENDS.register("transformers")
    def _transformers(cfg: PolicyConfig, cache_dir: Path) -> Backend: ...

    BACKENDS.get("vllm")          # KeyError: unknown inference backend 'vllm'; valid: openai, transformers

``loader`` fills a registry on first use (imports the modules that register themselves), so importing a
registry does not import every entry's dependencies; ``key_loaders`` fill it with one key's module only,
for callers that name one entry (``wolfpack play werewolf`` need not import the scenario engine: ~50 ms
of a command that should start in under 0.5 s); a key they do not register still runs ``loader``.
``error`` chooses the exception of a miss (a service
may want its own ``ServiceError``, e.g. INVALID_ARGUMENT for an unknown reward spec).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """``name`` (or ``name@version``) -> entry; see the module docstring."""

    def __init__(
        self,
        kind: str,
        *,
        loader: Callable[[], None] | None = None,
        key_loaders: Mapping[str, Callable[[], None]] | None = None,
        error: Callable[[str], Exception] = KeyError,
    ) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._loader = loader
        self._key_loaders = dict(key_loaders or {})
        self._error = error

    def _load(self) -> None:
        if self._loader is not None:
            loader, self._loader = self._loader, None  # once; entries it registers must not recurse
            loader()

    def add(self, key: str, entry: T) -> T:
        """Register ``entry`` under ``key``; another entry under the same key is an error (keys are
        versioned: a changed entry gets a new version). Re-adding the same object is a no-op."""
        if not key or key.count("@") > 1:
            raise ValueError(f"bad {self.kind} key {key!r}")
        version = key.partition("@")[2]
        if version and not (version.isdigit() and int(version) >= 1):
            raise ValueError(f"bad {self.kind} key {key!r}: the version must be an integer >= 1")
        known = self._entries.get(key)
        if known is not None and known is not entry:
            raise ValueError(f"{self.kind} {key!r} is already registered")
        self._entries[key] = entry
        return entry

    def register(self, key: str) -> Callable[[T], T]:
        """Decorator form of ``add``."""

        def deco(entry: T) -> T:
            return self.add(key, entry)

        return deco

    def get(self, key: str) -> T:
        """The entry under ``key``; for an unversioned ``name`` of versioned entries, the latest version.
        A miss raises ``error`` with the valid keys."""
        if key not in self._entries and key in self._key_loaders:
            self._key_loaders.pop(key)()
        if key not in self._entries:
            self._load()
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        if "@" not in key:
            versions = [
                int(k.partition("@")[2]) for k in self._entries if k.partition("@")[0] == key and "@" in k
            ]
            if versions:
                return self._entries[f"{key}@{max(versions)}"]
        raise self._error(
            f"unknown {self.kind} {key!r}; valid: {', '.join(sorted(self._entries)) or '(none)'}"
        )

    def __getitem__(self, key: str) -> T:
        return self.get(key)

    def __contains__(self, key: object) -> bool:
        self._load()
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def keys(self) -> list[str]:
        self._load()
        return list(self._entries)

    def values(self) -> list[T]:
        self._load()
        return list(self._entries.values())

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return list(self._entries.items())
