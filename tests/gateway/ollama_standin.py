"""A STAND-IN for an Ollama server, for the gateway's tests and benchmark.

This is not Ollama. It is a small aiohttp server that speaks the parts of
Ollama's HTTP API the gateway relies on, with the same shapes: `/api/generate`
and `/api/chat` stream NDJSON (one object per token, then a final object with
`done: true`, `done_reason` and the timing fields `total_duration`,
`load_duration`, `prompt_eval_count`, `prompt_eval_duration`, `eval_count`,
`eval_duration` in nanoseconds), `/api/embed`, `/api/tags`, `/api/ps`,
`/api/version`, `/api/show`, and the OpenAI-compatible `/v1/chat/completions`
and `/v1/completions` as server-sent events. It stands in until a real Ollama
runs in the tests (a separate issue).

Like the field report, a NON-streaming generation keeps running to the end
after its client leaves (and holds the engine's only slot while it does); a
streaming one stops as soon as its connection closes, because Ollama's handler
uses the request context. That asymmetry is exactly what the gateway exists to
exploit, and the stand-in records every generation so tests can check when
each one stopped and why.

Run as a process (the benchmark does): python -m tests.gateway.ollama_standin --port N
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from localmodel.engines import ollama


@dataclass
class Generation:
    """One generation the stand-in ran."""

    path: str
    body: dict[str, Any]
    streamed: bool
    started: float
    tokens: int = 0
    stopped: float | None = None
    stop_reason: str = ""  # "done" or "client_gone"


@dataclass
class StandinOllama:
    token_delay: float = 0.01  # seconds between tokens
    tokens: int = 20  # tokens per answer (num_predict can lower it)
    prefill_delay: float = 0.0  # seconds before the first token
    model: str = "standin:1b"
    loaded: bool = True  # what /api/ps reports
    fail_status: int | None = None  # answer every generation with this status
    error_after: int | None = None  # emit {"error": ...} after this many tokens
    drop_next: int = 0  # close this many generation connections without answering
    generations: list[Generation] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    keep_records: bool = True
    # Pace tokens on a fixed schedule (token i at start + (i+1) * token_delay)
    # instead of sleeping token_delay after each: timer lateness then does not
    # add up over a stream (the benchmark wants the proxy, not the pacing).
    steady: bool = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/generate", self.generate)
        app.router.add_post("/api/chat", self.generate)
        app.router.add_post("/api/embed", self.embed)
        app.router.add_get(ollama.TAGS_PATH, self.tags)
        app.router.add_get(ollama.PS_PATH, self.ps)
        app.router.add_get(ollama.VERSION_PATH, self.version)
        app.router.add_post(ollama.SHOW_PATH, self.show)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.openai)
        app.router.add_post("/v1/completions", self.openai)
        return app

    # ---- helpers ---------------------------------------------------------

    def _count(self, body: dict[str, Any]) -> int:
        n = self.tokens
        options = body.get("options") or {}
        predict = options.get("num_predict", body.get("max_tokens"))
        if isinstance(predict, int) and predict > 0:
            n = min(n, predict)
        return n

    def _chunk(self, path: str, body: dict[str, Any], piece: str) -> dict[str, Any]:
        now = datetime.now(UTC).isoformat()
        chunk: dict[str, Any] = {"model": body.get("model", self.model), "created_at": now}
        if path == "/api/chat":
            chunk["message"] = {"role": "assistant", "content": piece}
        else:
            chunk["response"] = piece
        chunk["done"] = False
        return chunk

    def _final(
        self, path: str, body: dict[str, Any], gen: Generation, reason: str
    ) -> dict[str, Any]:
        chunk = self._chunk(path, body, "")
        prompt = json.dumps(body.get("messages") or body.get("prompt") or "")
        chunk.update(
            done=True,
            done_reason=reason,
            total_duration=int((time.monotonic() - gen.started) * 1e9),
            load_duration=1_000_000,
            prompt_eval_count=max(1, len(prompt.split())),
            # Ollama 0.34.4 says how many came from its prompt cache
            # (docs/engine-facts.md, Prompt cache accounting); the stand-in has none.
            prompt_eval_cached_count=0,
            prompt_eval_duration=int(max(self.prefill_delay, 0.001) * 1e9),
            eval_count=gen.tokens,
            eval_duration=int(max(gen.tokens * self.token_delay, 0.001) * 1e9),
        )
        if path == "/api/generate":
            chunk["context"] = [1, 2, 3]
        return chunk

    async def _produce(self, gen: Generation, n: int, emit: Any) -> str:
        """Generate n tokens, calling emit(i) per token. Returns the done reason."""
        if self.prefill_delay:
            await asyncio.sleep(self.prefill_delay)
        loop = asyncio.get_running_loop()
        begin = loop.time()
        for i in range(n):
            if self.token_delay and self.steady:
                await asyncio.sleep(max(0.0, begin + (i + 1) * self.token_delay - loop.time()))
            elif self.token_delay:
                await asyncio.sleep(self.token_delay)
            gen.tokens += 1
            await emit(i)
        return "length" if n < self.tokens else "stop"

    def _begin(self, path: str, body: dict[str, Any], streamed: bool) -> Generation:
        gen = Generation(path, body, streamed, time.monotonic())
        if self.keep_records:
            self.generations.append(gen)
            self.requests.append((path, body))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        return gen

    def _end(self, gen: Generation, reason: str) -> None:
        if gen.stopped is None:
            gen.stopped = time.monotonic()
            gen.stop_reason = reason
            self.active -= 1

    # ---- Ollama API ------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        path = request.path
        if self.drop_next > 0:
            self.drop_next -= 1
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("stand-in dropped the connection")
        if self.fail_status is not None:
            return web.json_response({"error": "stand-in failure"}, status=self.fail_status)
        streamed = body.get("stream", True) is not False
        gen = self._begin(path, body, streamed)
        n = self._count(body)
        if not streamed:
            # The field failure: the work goes on whether or not anyone waits.
            task = asyncio.ensure_future(self._run_to_end(path, body, gen, n))
            result = await asyncio.shield(task)
            return web.json_response(result)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})

        async def emit(i: int) -> None:
            if self.error_after is not None and i >= self.error_after:
                await response.write(b'{"error":"stand-in engine failure"}\n')
                raise _Stop
            line = json.dumps(self._chunk(path, body, f"tok{i} ")).encode() + b"\n"
            await response.write(line)

        try:
            await response.prepare(request)
            reason = await self._produce(gen, n, emit)
            final = self._final(path, body, gen, reason)
            await response.write(json.dumps(final, separators=(",", ":")).encode() + b"\n")
            await response.write_eof()
            self._end(gen, "done")
        except _Stop:
            self._end(gen, "error")
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
        except asyncio.CancelledError:
            self._end(gen, "client_gone")
            raise
        except ConnectionError:
            self._end(gen, "client_gone")
        return response

    async def _run_to_end(
        self, path: str, body: dict[str, Any], gen: Generation, n: int
    ) -> dict[str, Any]:
        pieces: list[str] = []

        async def emit(i: int) -> None:
            pieces.append(f"tok{i} ")

        reason = await self._produce(gen, n, emit)
        self._end(gen, "done")
        final = self._final(path, body, gen, reason)
        if path == "/api/chat":
            final["message"]["content"] = "".join(pieces)
        else:
            final["response"] = "".join(pieces)
        return final

    async def embed(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.keep_records:
            self.requests.append((request.path, body))
        inputs = body.get("input")
        count = len(inputs) if isinstance(inputs, list) else 1
        return web.json_response(
            {
                "model": body.get("model", self.model),
                "embeddings": [[0.1, 0.2, 0.3] for _ in range(count)],
                "total_duration": 2_000_000,
                "load_duration": 1_000_000,
                "prompt_eval_count": count,
            }
        )

    async def tags(self, request: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": self.model, "model": self.model}]})

    async def ps(self, request: web.Request) -> web.Response:
        models = [{"name": self.model, "model": self.model}] if self.loaded else []
        return web.json_response({"models": models})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0-standin"})

    async def show(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.keep_records:
            self.requests.append((ollama.SHOW_PATH, body))
        return web.json_response({"modelfile": f"FROM {body.get('model')}", "details": {},
                                  "model_info": {}})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )

    # ---- OpenAI-compatible ----------------------------------------------

    async def openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        gen = self._begin(request.path, body, True)
        n = self._count(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        base = {"id": "cmpl-standin", "created": 1, "model": body.get("model", self.model)}
        obj = "chat.completion.chunk" if chat else "text_completion"

        async def emit(i: int) -> None:
            choice: dict[str, Any] = {"index": 0, "finish_reason": None}
            if chat:
                choice["delta"] = {"content": f"tok{i} "}
            else:
                choice["text"] = f"tok{i} "
            event = {**base, "object": obj, "choices": [choice]}
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")

        try:
            await response.prepare(request)
            reason = await self._produce(gen, n, emit)
            last: dict[str, Any] = {"index": 0, "finish_reason": reason}
            if chat:
                last["delta"] = {}
            else:
                last["text"] = ""
            await response.write(
                b"data: "
                + json.dumps({**base, "object": obj, "choices": [last]}).encode()
                + b"\n\n"
            )
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": 3,
                    "completion_tokens": gen.tokens,
                    "total_tokens": 3 + gen.tokens,
                }
                event = {**base, "object": obj, "choices": [], "usage": usage}
                await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            self._end(gen, "done")
        except asyncio.CancelledError:
            self._end(gen, "client_gone")
            raise
        except ConnectionError:
            self._end(gen, "client_gone")
        return response


class _Stop(Exception):
    pass


async def start_standin(
    standin: StandinOllama, host: str = "127.0.0.1"
) -> tuple[web.AppRunner, str]:
    """Serve the stand-in on a free loopback port. Handler cancellation mirrors
    Ollama's use of the request context: a closed connection stops a stream."""
    runner = web.AppRunner(standin.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://{host}:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--steady", action="store_true", help="pace tokens on a fixed schedule")
    args = parser.parse_args()
    standin = StandinOllama(
        token_delay=args.token_delay, tokens=args.tokens, keep_records=False, steady=args.steady
    )
    web.run_app(
        standin.app(),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()
