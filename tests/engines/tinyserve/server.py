"""tinyserve: a STAND-IN engine the tests start, not a real one. It loads no
weights and runs no model: it answers every generation with deterministic
text (the words of `SPEECH`, one token each) and reports its own, invented,
account of the work. It exists to prove that an engine speaking a dialect of
its own is one package (tests/engines/tinyserve/): the operator renders and
places it, doctor recognises it, the gateway and the router serve it.

Its dialect, unlike Ollama's (OLLAMA_* variables, `*_duration` in ns) and
llama-server's (flags, `timings` in ms):

- **configured by one JSON file** (`python -m tests.engines.tinyserve.server
  CONFIG`; in a pod its init step writes it): `listen`, `serve_as`,
  `weights`, `workers`, `lanes`, `window`, `kv`, `fused_attention`,
  `memo_mib`;
- **health at `/tiny/health`** (200 `{"state": "serving"}` once it serves, 503
  `{"state": "warming"}` before), its state at `/tiny/state`;
- **OpenAI-compatible** `/v1/chat/completions` and `/v1/completions` (SSE
  when `stream`), with no `usage` and no `timings`: its last chunk carries
  `tiny_ledger` (`read_tokens`, `reused_tokens`, `wrote_tokens`, `read_us`,
  `wrote_us`, `warm_us`: microseconds) and `stop_cause`; `"exact_length":
  true` makes it write exactly `max_tokens` tokens.

The times are a fixed cost per token (`READ_US`, `WROTE_US`), so a test can
say what the ledger must hold. `reused_tokens` counts the words the prompt
shares, from its start, with the previous prompt of the same lane (its prompt
memo).
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.engines.tinyserve import HEALTH_PATH, LEDGER_KEY, STATE_PATH, STOP_KEY, VERSION

SPEECH = ["tiny", "answers", "from", "a", "stand", "in", "engine", "that", "runs", "no", "model",
          "at", "all"]
READ_US = 250  # microseconds per prompt token read
WROTE_US = 4000  # microseconds per token written
WARM_US = 1500  # the first answer's warm-up, once


@dataclass(frozen=True)
class Config:
    """What tinyserve's config file says."""

    listen: str
    serve_as: str
    weights: str = ""
    workers: int = 1
    lanes: int = 1
    window: int = 2048
    kv: str = "f16"
    fused_attention: str = "auto"
    memo_mib: int = 0
    ledger: str = "off"  # "on": its account of each generation on every answer

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host, int(port)


def read_config(path: Path) -> Config:
    doc = json.loads(path.read_text())
    return Config(**{k: doc[k] for k in Config.__dataclass_fields__ if k in doc})


def words(body: Mapping[str, Any]) -> list[str]:
    """The prompt's tokens: its words (a chat's message contents, in order)."""
    if isinstance(body.get("messages"), list):
        text = " ".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    return text.split()


@dataclass
class TinyServe:
    config: Config
    warming: bool = False  # answers 503 at its health path while true
    answered: int = 0
    last_prompt: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(HEALTH_PATH, self.health)
        app.router.add_get(STATE_PATH, self.state)
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/completions", self.complete)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if self.warming:
            return web.json_response({"state": "warming"}, status=503)
        return web.json_response({"state": "serving"})

    async def state(self, request: web.Request) -> web.Response:
        c = self.config
        return web.json_response({
            "engine": "tinyserve", "version": VERSION, "serving": c.serve_as,
            "weights": c.weights, "workers": c.workers, "lanes": c.lanes,
            "window": c.window, "warming": self.warming,
        })

    def _ledger(self, prompt: list[str], wrote: int) -> dict[str, int]:
        shared = 0
        for a, b in zip(prompt, self.last_prompt, strict=False):
            if a != b:
                break
            shared += 1
        self.last_prompt = prompt
        read = len(prompt) - shared
        warm = WARM_US if self.answered == 0 else 0
        self.answered += 1
        return {"read_tokens": read, "reused_tokens": shared, "wrote_tokens": wrote,
                "read_us": read * READ_US, "wrote_us": wrote * WROTE_US, "warm_us": warm}

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("model") not in (None, "", self.config.serve_as):
            return web.json_response(
                {"error": {"message": f"tinyserve serves {self.config.serve_as} only"}},
                status=404)
        chat = request.path.endswith("/chat/completions")
        limit = int(body.get("max_tokens") or len(SPEECH))
        exact = body.get("exact_length") is True
        count = limit if exact else min(limit, len(SPEECH))
        pieces = [SPEECH[i % len(SPEECH)] + " " for i in range(count)]
        cause = "length" if count == limit and (exact or limit < len(SPEECH)) else "stop"
        ledger = self._ledger(words(body), len(pieces))
        account = {LEDGER_KEY: ledger, STOP_KEY: cause} if self.config.ledger == "on" else {}
        base = {"id": f"tiny-{self.answered}", "created": 0, "model": self.config.serve_as}
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": cause}
            text = "".join(pieces)
            choice |= {"message": {"role": "assistant", "content": text}} if chat else {
                "text": text}
            return web.json_response({**base, "object": obj, "choices": [choice], **account})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def event(choice: dict[str, Any], **extra: Any) -> None:
            doc = {**base, "object": obj + ".chunk" if chat else obj, "choices": [choice],
                   **extra}
            await response.write(b"data: " + json.dumps(doc).encode() + b"\n\n")

        for piece in pieces:
            await asyncio.sleep(0)
            part = {"delta": {"content": piece}} if chat else {"text": piece}
            await event({"index": 0, **part, "finish_reason": None})
        end: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
        await event({"index": 0, **end, "finish_reason": cause}, **account)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def serve(config: Config) -> web.AppRunner:
    """Start serving on the config's address (port 0: a free one); the runner."""
    runner = web.AppRunner(TinyServe(config).app(), access_log=None)
    await runner.setup()
    host, port = config.host_port
    await web.TCPSite(runner, host, port).start()
    return runner


def check(config: Config) -> int:
    """`tinyserve check CONFIG`: 0 when its health path says it serves (its probe)."""
    host, port = config.host_port
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{HEALTH_PATH}", timeout=4):
            return 0
    except OSError:
        return 1


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[0] != "check"):
        print("usage: python -m tests.engines.tinyserve.server [check] CONFIG.json",
              file=sys.stderr)
        return 2
    config = read_config(Path(argv[-1]))
    if len(argv) == 2:
        return check(config)
    web.run_app(TinyServe(config).app(), host=config.host_port[0], port=config.host_port[1],
                access_log=None, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
