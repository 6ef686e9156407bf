"""LLM-assisted variation keeps everything a verifier needs, or keeps the original."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from wolfpack_games.scenarios import generate_scenario
from wolfpack_games.scenarios.variation import check_paraphrase, openai_chat, vary


def test_check_paraphrase_rules() -> None:
    assert check_paraphrase("Pay at most 300, then FINAL_BID.", "Never pay above 300; use FINAL_BID.") == ""
    assert "numbers changed" in check_paraphrase("at most 300", "at most 350")
    assert "keywords dropped" in check_paraphrase("write ACCEPT", "write yes")


def test_faithful_paraphrase_is_accepted_with_a_new_id() -> None:
    sc = generate_scenario("bargaining", 4, "easy")

    def chat(prompt: str) -> str:
        payload = json.loads(prompt.split("\n\n", 1)[1])
        return json.dumps(
            {"public": "In short: " + payload["public"], "briefs": ["Note: " + b for b in payload["briefs"]]}
        )

    out = vary(sc, chat)
    assert out.accepted, out.reason
    assert out.scenario.id != sc.id and "llm-varied" in out.scenario.tags
    assert out.scenario.params == sc.params and [p.private for p in out.scenario.players] == [
        p.private for p in sc.players
    ]


@pytest.mark.parametrize(
    "reply",
    ["not json at all", json.dumps({"public": "x"}), json.dumps({"public": "Price 1", "briefs": ["a", "b"]})],
)
def test_unfaithful_or_broken_replies_keep_the_original(reply: str) -> None:
    sc = generate_scenario("bargaining", 4, "easy")
    out = vary(sc, lambda _prompt: reply)
    assert not out.accepted and out.scenario == sc and out.reason


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        payload = json.loads(prompt.split("\n\n", 1)[1])
        content = json.dumps({"public": payload["public"] + " (rephrased)", "briefs": payload["briefs"]})
        answer = {
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        }  # fmt: skip
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Handler)  # the server binds port 0 itself: no free-port race
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/v1"
    server.shutdown()


def test_openai_compatible_endpoint_round_trip(endpoint: str) -> None:
    sc = generate_scenario("allocation", 2, "medium")
    out = vary(sc, openai_chat(endpoint, "any-model"))
    assert out.accepted, out.reason
    assert out.scenario.public.endswith("(rephrased)")
