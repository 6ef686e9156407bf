"""Scenario store: a ``ScenarioStore`` protocol and its SQLite implementation (stdlib ``sqlite3``).

Why SQLite by default: one file, no server, transactional, and fast enough for the CLI and the
curriculum service's sampling. Scenarios are stored as canonical JSON keyed by their content-hash id,
so inserts are idempotent; family/split/difficulty are columns and tags a side table so filters are
indexed. A Redis backend can implement the same protocol.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, runtime_checkable

from wolfpack_games.scenarios.models import Scenario

DEFAULT_PATH = Path("scenarios.sqlite3")


@runtime_checkable
class ScenarioStore(Protocol):
    """What every scenario backend offers."""

    def insert(self, scenarios: Scenario | Iterable[Scenario]) -> int:
        """Store scenarios; already-present ids are skipped. Returns how many were new."""
        ...

    def get(self, scenario_id: str) -> Scenario | None: ...

    def list(
        self,
        *,
        family: str | None = None,
        split: str | None = None,
        tag: str | None = None,
        difficulty: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Scenario]:
        """Matching scenarios ordered by id (stable for paging)."""
        ...

    def count(
        self,
        *,
        family: str | None = None,
        split: str | None = None,
        tag: str | None = None,
        difficulty: str | None = None,
    ) -> int: ...

    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS scenarios (
    id TEXT PRIMARY KEY,
    family TEXT NOT NULL,
    difficulty TEXT NOT NULL,
    split TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS scenarios_family ON scenarios(family, split, difficulty);
CREATE TABLE IF NOT EXISTS scenario_tags (
    id TEXT NOT NULL REFERENCES scenarios(id) ON DELETE CASCADE,
    tag TEXT NOT NULL,
    PRIMARY KEY (id, tag)
);
CREATE INDEX IF NOT EXISTS scenario_tags_tag ON scenario_tags(tag);
"""


class SQLiteScenarioStore:
    """``ScenarioStore`` on a SQLite file (``":memory:"`` works for tests)."""

    def __init__(self, path: str | Path = DEFAULT_PATH) -> None:
        self.path = str(path)
        self._conn = sqlite3.connect(self.path)
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._conn.executescript(_SCHEMA)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._conn:
            yield self._conn

    def insert(self, scenarios: Scenario | Iterable[Scenario]) -> int:
        items = [scenarios] if isinstance(scenarios, Scenario) else list(scenarios)
        new = 0
        with self._tx() as conn:
            for sc in items:
                body = json.dumps(sc.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
                cur = conn.execute(
                    "INSERT OR IGNORE INTO scenarios(id, family, difficulty, split, body) VALUES (?,?,?,?,?)",
                    (sc.id, sc.family, sc.difficulty, sc.split, body),
                )
                if cur.rowcount:
                    new += 1
                    conn.executemany(
                        "INSERT OR IGNORE INTO scenario_tags(id, tag) VALUES (?, ?)",
                        [(sc.id, tag) for tag in sc.tags],
                    )
        return new

    def get(self, scenario_id: str) -> Scenario | None:
        row = self._conn.execute("SELECT body FROM scenarios WHERE id = ?", (scenario_id,)).fetchone()
        return None if row is None else Scenario.model_validate_json(row[0])

    @staticmethod
    def _where(
        family: str | None, split: str | None, tag: str | None, difficulty: str | None
    ) -> tuple[str, list[str]]:
        clauses: list[str] = []
        args: list[str] = []
        for column, value in (("family", family), ("split", split), ("difficulty", difficulty)):
            if value is not None:
                clauses.append(f"s.{column} = ?")
                args.append(value)
        if tag is not None:
            clauses.append("EXISTS (SELECT 1 FROM scenario_tags t WHERE t.id = s.id AND t.tag = ?)")
            args.append(tag)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def list(
        self,
        *,
        family: str | None = None,
        split: str | None = None,
        tag: str | None = None,
        difficulty: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Scenario]:
        where, args = self._where(family, split, tag, difficulty)
        sql = f"SELECT body FROM scenarios s{where} ORDER BY s.id LIMIT ? OFFSET ?"
        rows = self._conn.execute(sql, [*args, -1 if limit is None else limit, offset]).fetchall()
        return [Scenario.model_validate_json(r[0]) for r in rows]

    def count(
        self,
        *,
        family: str | None = None,
        split: str | None = None,
        tag: str | None = None,
        difficulty: str | None = None,
    ) -> int:
        where, args = self._where(family, split, tag, difficulty)
        row = self._conn.execute(f"SELECT COUNT(*) FROM scenarios s{where}", args).fetchone()
        return int(row[0])

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SQLiteScenarioStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisScenarioStore:
    """``ScenarioStore`` on Redis, for deployments where several services share one scenario pool.

    Layout under ``prefix``: ``<prefix>:sc:<id>`` holds the JSON body; sets ``<prefix>:idx:all``,
    ``<prefix>:idx:family:<f>``, ``:split:<s>``, ``:difficulty:<d>`` and ``:tag:<t>`` index the ids, so a
    filtered listing is one SINTER plus one MGET. Inserts are idempotent by id (``SET NX``).
    """

    def __init__(self, url: str, prefix: str = "wolfpack:scenarios") -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.prefix = prefix

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def insert(self, scenarios: Scenario | Iterable[Scenario]) -> int:
        items = [scenarios] if isinstance(scenarios, Scenario) else list(scenarios)
        new = 0
        for sc in items:
            body = json.dumps(sc.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
            if not self.client.set(self._key("sc", sc.id), body, nx=True):
                continue
            new += 1
            pipe = self.client.pipeline(transaction=True)
            pipe.sadd(self._key("idx", "all"), sc.id)
            pipe.sadd(self._key("idx", "family", sc.family), sc.id)
            pipe.sadd(self._key("idx", "difficulty", sc.difficulty), sc.id)
            pipe.sadd(self._key("idx", "split", sc.split or ""), sc.id)
            for tag in sc.tags:
                pipe.sadd(self._key("idx", "tag", tag), sc.id)
            pipe.execute()
        return new

    def get(self, scenario_id: str) -> Scenario | None:
        body = self.client.get(self._key("sc", scenario_id))
        return None if body is None else Scenario.model_validate_json(body)

    def _ids(
        self, family: str | None, split: str | None, tag: str | None, difficulty: str | None
    ) -> list[str]:
        keys = [self._key("idx", "all")]
        for kind, value in (("family", family), ("split", split), ("tag", tag), ("difficulty", difficulty)):
            if value is not None:
                keys.append(self._key("idx", kind, value))
        ids = self.client.sinter(keys)
        return sorted(i.decode() if isinstance(i, bytes) else str(i) for i in ids)

    def list(
        self,
        *,
        family: str | None = None,
        split: str | None = None,
        tag: str | None = None,
        difficulty: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Scenario]:
        ids = self._ids(family, split, tag, difficulty)
        page = ids[offset:] if limit is None else ids[offset : offset + limit]
        if not page:
            return []
        bodies = self.client.mget([self._key("sc", i) for i in page])
        return [Scenario.model_validate_json(b) for b in bodies if b is not None]

    def count(
        self,
        *,
        family: str | None = None,
        split: str | None = None,
        tag: str | None = None,
        difficulty: str | None = None,
    ) -> int:
        return len(self._ids(family, split, tag, difficulty))

    def close(self) -> None:
        self.client.close()


def open_store(url: str | Path = DEFAULT_PATH) -> ScenarioStore:
    """Open a store from a path, a ``sqlite:///path`` URL, or a ``redis://`` / ``rediss://`` URL."""
    text = str(url)
    if text.startswith(("redis://", "rediss://", "unix://")):
        return RedisScenarioStore(text)
    if text.startswith("sqlite:///"):
        text = text[len("sqlite:///") :]
    elif "://" in text:
        raise ValueError(f"unsupported scenario store URL {text!r} (use a path, sqlite:///path or redis://)")
    return SQLiteScenarioStore(text)
