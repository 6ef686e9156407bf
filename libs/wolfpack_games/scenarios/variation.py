"""Optional LLM-assisted variation of scenario wording (off by default).

Why: templated scenarios all read alike, and a policy can learn the template instead of the skill. An
LLM behind any OpenAI-compatible endpoint may paraphrase the *wording* (public description and private
briefs) while everything a verifier uses (params, private numbers, roles, turn limits) stays fixed.

Why it is safe: the verifier never reads the text, and a paraphrase is accepted only if it keeps every
number and every formal keyword (``FINAL_BID``, ``ACCEPT``, ``ALLOCATION``…) of the original; otherwise
the original scenario is kept and the reason is returned. A varied scenario gets a new content-hash id
and the tag ``llm-varied``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from wolfpack_games.scenarios.models import Scenario

NUMBER = re.compile(r"\d+(?:\.\d+)?")
KEYWORD = re.compile(r"\b[A-Z][A-Z_]{2,}\b")
PROMPT = (
    "Rewrite the wording of this negotiation/social scenario so it reads naturally and differently, in the "
    "same language. Keep every number exactly as written, keep every UPPERCASE keyword (like FINAL_BID, "
    "ACCEPT, ALLOCATION) unchanged, keep names and roles, add no new facts. Answer with JSON only: "
    '{"public": "...", "briefs": ["...", ...]} with one brief per player, in order.\n\n'
)


class ChatFn(Protocol):
    def __call__(self, prompt: str) -> str: ...


@dataclass(frozen=True)
class Variation:
    scenario: Scenario
    accepted: bool
    reason: str


def _facts(text: str) -> tuple[list[str], set[str]]:
    return sorted(NUMBER.findall(text)), set(KEYWORD.findall(text))


def check_paraphrase(original: str, rewritten: str) -> str:
    """Empty when ``rewritten`` keeps every number (with multiplicity) and keyword of ``original``."""
    nums0, keys0 = _facts(original)
    nums1, keys1 = _facts(rewritten)
    if nums0 != nums1:
        return f"numbers changed: {nums0} -> {nums1}"
    missing = keys0 - keys1
    if missing:
        return f"keywords dropped: {sorted(missing)}"
    return ""


def vary(scenario: Scenario, chat: ChatFn) -> Variation:
    """Ask ``chat`` for a paraphrase; keep the original unless the paraphrase passes every check."""
    payload = {"public": scenario.public, "briefs": [p.brief for p in scenario.players]}
    try:
        reply = chat(PROMPT + json.dumps(payload, ensure_ascii=False))
        start, end = reply.find("{"), reply.rfind("}")
        data: dict[str, Any] = json.loads(reply[start : end + 1])
        public = str(data["public"])
        briefs = [str(b) for b in data["briefs"]]
    except Exception as exc:  # any model failure keeps the original scenario
        return Variation(scenario, False, f"unusable reply: {type(exc).__name__}: {exc}")
    if len(briefs) != len(scenario.players):
        return Variation(scenario, False, f"expected {len(scenario.players)} briefs, got {len(briefs)}")
    problems = [check_paraphrase(scenario.public, public)]
    problems += [check_paraphrase(p.brief, b) for p, b in zip(scenario.players, briefs, strict=True)]
    problem = next((p for p in problems if p), "")
    if problem:
        return Variation(scenario, False, problem)
    data_out = scenario.model_dump(mode="json", exclude={"id", "split"})
    data_out["public"] = public
    for player, brief in zip(data_out["players"], briefs, strict=True):
        player["brief"] = brief
    data_out["tags"] = sorted({*scenario.tags, "llm-varied"})
    return Variation(Scenario.model_validate(data_out), True, "ok")


def openai_chat(base_url: str, model: str, api_key: str = "", timeout_s: float = 60.0) -> ChatFn:
    """A ``ChatFn`` over any OpenAI-compatible ``/v1/chat/completions`` endpoint."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout_s, max_retries=2)

    def chat(prompt: str) -> str:
        resp = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=0.7
        )
        return resp.choices[0].message.content or ""

    return chat
