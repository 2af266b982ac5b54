"""Quill in the seq2seq benchmark: `quill serve` on the Marian directory, token-id sources sent to /v1/completions
(the prompt is the encoder's input), offline (all at once, a fixed number in flight) and online (Poisson arrivals).

Requests are not streamed, ask for exactly `new_tokens` tokens (`max_tokens`, `ignore_eos`), greedy
(`temperature` 0) or beam search (`use_beam_search`, `best_of` the width, `n` 1); generated tokens are what the
server counts (`usage.completion_tokens`). A server that does not start (it refuses the checkpoint, say) is reported
with the reason it gave, and its figures are left out.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from quill.clients.bench.runner import http_client
from quill.server.config import ServerConfig

from .seq2seq_runs import online_summary
from .server_process import free_port, serve_command, server_process


class QuillUnavailable(RuntimeError):
    """The server did not start, or did not serve the requests: `reason` says why, in the server's words."""

    def __init__(self, reason: str, refused: bool):
        super().__init__(reason)
        self.reason, self.refused = reason, refused


_REFUSALS = re.compile(r"unsupported|not supported|cannot load|missing file|no .* for model_type", re.I)


def start_failure(message: str) -> QuillUnavailable:
    """What `running_server`'s error says of a server that stopped before it was ready: its error lines, shortest
    form (timestamps and logger names cut), and whether it refused the model (rather than failing otherwise)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [re.sub(r"^\S+ \S+ (ERROR|CRITICAL) [\w.]+: ", "", line) for line in lines
              if " ERROR " in line or " CRITICAL " in line or _REFUSALS.search(line)]
    reason = ("; ".join(dict.fromkeys(errors)) or lines[-1]) if lines else message
    return QuillUnavailable(reason[:600], refused=bool(_REFUSALS.search(reason)))


def cache_bytes(concurrency: int, beams: int, longest_source: int, new_tokens: int, layers: int, d_model: int,
                block_size: int, dtype_bytes: int = 4) -> int:
    """Room for every sequence in flight (`concurrency` requests x `beams`), generously: keys and values of its
    self-attention and of its cross-attention over the source (`dtype_bytes` each), each rounded up to blocks, plus
    a block."""
    per_token = 2 * layers * d_model * dtype_bytes  # K and V, every decoder layer
    tokens = -(-(longest_source + block_size) // block_size) * block_size + \
        -(-(new_tokens + block_size) // block_size) * block_size
    return concurrency * beams * tokens * per_token


def start_quill(stack: ExitStack, hf_dir: Path, name: str, threads: int, max_num_seqs: int, cache: int,
                extra_args: list[str], ready_timeout: float, log, device: str = "cpu", dtype: str = "float32",
                ) -> tuple[str, list[str], ServerOutput]:
    """(URL, command, its output) of a `quill serve` on `hf_dir`, stopped when `stack` closes; QuillUnavailable if
    it does not start."""
    config = ServerConfig(models=[f"{name}={hf_dir}"], host="127.0.0.1", port=free_port(), device=device,
                          dtype=dtype, max_num_seqs=max_num_seqs, cache_bytes=cache)
    args = ["--threads", str(threads), *extra_args]
    command = ["python", *serve_command(config)[1:], *args]
    log(f"starting Quill: {' '.join(command)}")
    output = stack.enter_context(tempfile.TemporaryFile(mode="w+"))
    try:
        url, process = stack.enter_context(server_process(config, ready_timeout, threads, args, output))
    except (RuntimeError, TimeoutError) as e:
        raise start_failure(str(e)) from None
    return url, command, ServerOutput(process, output)


class ServerOutput:
    """A running server's process and what it has printed, to say why requests failed."""

    def __init__(self, process, file):
        self.process, self.file = process, file

    def tail(self, chars: int = 3000) -> str:
        self.file.flush()
        self.file.seek(0)
        text = self.file.read()[-chars:]
        self.file.seek(0, 2)
        state = "running" if self.process.poll() is None else f"exited with {self.process.returncode}"
        return f"the server is {state}; the end of its output:\n{text}"


def request_body(name: str, source: list[int], new_tokens: int, beams: int) -> dict:
    body = {"model": name, "prompt": source, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True,
            "stream": False}
    if beams > 1:
        body |= {"use_beam_search": True, "n": 1, "best_of": beams}
    return body


async def _one(http, body: dict) -> tuple[int, str, str | None]:
    """(completion tokens, text, error or None) of one request."""
    try:
        response = await http.post("/v1/completions", json=body)
    except httpx.TransportError as e:  # the connection broke: the server stopped, say
        return 0, "", f"{type(e).__name__}: {e}"
    if response.status_code != 200:
        try:
            error = response.json().get("error", {}).get("message")
        except (ValueError, AttributeError):
            error = response.text[:300]
        return 0, "", f"HTTP {response.status_code}: {error}"
    answer = response.json()
    return answer["usage"]["completion_tokens"], answer["choices"][0]["text"], None


def _check(results: list[tuple[int, str, str | None]], new_tokens: int, what: str) -> None:
    failed = [e for _, _, e in results if e]
    if failed:
        raise QuillUnavailable(f"{what}: {len(failed)} of {len(results)} requests failed; first: {failed[0]}",
                               refused=bool(_REFUSALS.search(failed[0])))
    wrong = [n for n, _, _ in results if n != new_tokens]
    if wrong:
        raise QuillUnavailable(f"{what}: {len(wrong)} answers counted other than {new_tokens} completion tokens "
                               f"(e.g. {wrong[0]})", refused=False)


async def _offline(url: str, name: str, sources: list[list[int]], warm: list[list[int]], new_tokens: int, beams: int,
                   concurrency: int):
    slots = asyncio.Semaphore(concurrency)

    async def one(source):
        async with slots:
            return await _one(http, request_body(name, source, new_tokens, beams))

    async with http_client(url, None, timeout=3600.0) as http:
        _check(await asyncio.gather(*(one(s) for s in warm)), new_tokens, "warm-up")
        start = time.perf_counter()
        results = await asyncio.gather(*(one(s) for s in sources))
        return results, time.perf_counter() - start


def quill_offline(url: str, name: str, sources: list[list[int]], warm: list[list[int]], new_tokens: int, beams: int,
                  concurrency: int) -> tuple[dict, list[str]]:
    """All sources, `concurrency` in flight, after the `warm` ones untimed (others: the server keeps the encoder
    outputs of sources it has seen); (figures, texts)."""
    results, seconds = asyncio.run(_offline(url, name, sources, warm, new_tokens, beams, concurrency))
    _check(results, new_tokens, f"beams {beams}")
    generated = sum(n for n, _, _ in results)
    return {"engine": "quill", "beams": beams, "sentences": len(sources), "generated_tokens": generated,
            "seconds": seconds, "tokens_per_s": generated / seconds, "sentences_per_s": len(sources) / seconds,
            "concurrency": concurrency}, [t for _, t, _ in results]


async def _online(url: str, name: str, sources: list[list[int]], offsets: list[float], new_tokens: int, beams: int,
                  drain_cap: float):
    arrivals: list[float] = [0.0] * len(sources)
    done: list[float | None] = [None] * len(sources)
    outcomes: list[tuple[int, str, str | None] | None] = [None] * len(sources)

    async with http_client(url, None, timeout=3600.0) as http:
        async def one(index: int, source: list[int]):
            arrivals[index] = time.perf_counter()
            outcomes[index] = await _one(http, request_body(name, source, new_tokens, beams))
            done[index] = time.perf_counter()

        start, tasks = time.perf_counter(), []
        for index, (source, offset) in enumerate(zip(sources, offsets)):
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            tasks.append(asyncio.create_task(one(index, source)))
        _, late = await asyncio.wait(tasks, timeout=drain_cap)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return arrivals, done, outcomes


def quill_online(url: str, name: str, sources: list[list[int]], offsets: list[float], new_tokens: int, beams: int,
                 drain_cap: float, rate: float) -> dict:
    """Sources sent at `offsets`, each answered in full (not streamed); requests unanswered `drain_cap` seconds
    after the last arrival are cancelled and count as never answered."""
    arrivals, done, outcomes = asyncio.run(_online(url, name, sources, offsets, new_tokens, beams, drain_cap))
    _check([o for o in outcomes if o is not None], new_tokens, f"online, rate {rate:g}/s")
    return online_summary("quill", rate, arrivals, done, new_tokens, drain_cap_s=drain_cap)
