"""Constraints compiled once per schema, with a time limit, off the engine's step loop.

The API process compiles a request's constraint on this compiler's threads before it submits the request
(`check`), so a schema that is wrong, uses a keyword llguidance does not implement, or takes longer than
`timeout_s` is a 400 and never reaches the engine. Compiled matchers are kept by constraint in an LRU; each
sequence gets a copy (`matcher`). An engine in its own process cannot be sent a compiled matcher (a Rust
object), so it compiles the same source again through a compiler of its own, which the check has shown to
be valid and quick.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from llguidance import LLMatcher, LLParserLimits, LLTokenizer

from quill.models.text.tokenizer import Tokenizer

from .constraint import StructuredOutput
from .grammar_source import GrammarError, grammar_text
from .matcher import GrammarMatcher
from .tokenizer_info import grammar_tokenizer

DEFAULT_TIMEOUT_S = 5.0


class GrammarCompiler:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: list[int], vocab_size: int, *, cache_size: int = 256,
                 timeout_s: float = DEFAULT_TIMEOUT_S, num_threads: int = 2):
        self._tokenizer_source = (tokenizer, list(eos_token_ids), vocab_size)
        self._tokenizer: LLTokenizer | None = None  # built on first use: ~1 s for a 128k vocabulary
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self.timeout_s = timeout_s
        self.limits = LLParserLimits(verbose_errors=False)  # verbose errors quote the whole grammar
        self._compiled: OrderedDict[tuple[str, str], LLMatcher | GrammarError] = OrderedDict()
        self._running: dict[tuple[str, str], Future] = {}
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(num_threads, thread_name_prefix="quill-grammar")

    @property
    def tokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = grammar_tokenizer(*self._tokenizer_source)
            return self._tokenizer

    def compile(self, structured: StructuredOutput) -> LLMatcher:
        """The compiled constraint (cached), waiting for it however long it takes; GrammarError if it is refused."""
        return self._outcome(self._start(structured).result())

    async def check(self, structured: StructuredOutput) -> None:
        """Compile on the compiler's threads, waiting at most `timeout_s`; GrammarError if refused or too slow.

        A compile past its time keeps its thread until llguidance's own limits end it; its key is then
        remembered as too slow, so that the same schema sent again is refused at once."""
        future = self._start(structured)
        try:
            outcome = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.timeout_s)
        except asyncio.TimeoutError:
            self._remember(structured.key, GrammarError(
                f"compiling the {structured.kind} constraint took longer than {self.timeout_s:g} s; simplify it"))
            raise self._compiled[structured.key] from None
        self._outcome(outcome)

    def matcher(self, structured: StructuredOutput) -> GrammarMatcher:
        """A matcher in its start state for one sequence."""
        return GrammarMatcher(self.compile(structured).deep_copy())

    # ---- the cache ---------------------------------------------------------------------------------

    def _start(self, structured: StructuredOutput) -> Future:
        key = structured.key
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                done: Future = Future()
                done.set_result(self._compiled[key])
                return done
            if key not in self._running:
                self._running[key] = self._threads.submit(self._compile, structured)
            return self._running[key]

    def _compile(self, structured: StructuredOutput) -> LLMatcher | GrammarError:
        try:
            matcher = LLMatcher(self.tokenizer, grammar_text(structured), limits=self.limits, log_level=0)
            outcome = GrammarError(refusal(matcher.get_error())) if matcher.is_error() else matcher
        except GrammarError as e:
            outcome = e
        except Exception as e:  # llguidance raises ValueError for a schema it cannot parse as JSON at all
            outcome = GrammarError(str(e))
        self._remember(structured.key, outcome)
        return outcome

    def _remember(self, key: tuple[str, str], outcome: LLMatcher | GrammarError) -> None:
        with self._lock:
            self._running.pop(key, None)
            if isinstance(self._compiled.get(key), GrammarError):
                return  # refused as too slow first: it stays refused
            self._compiled[key] = outcome
            self._compiled.move_to_end(key)
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)

    @staticmethod
    def _outcome(outcome: LLMatcher | GrammarError) -> LLMatcher:
        if isinstance(outcome, GrammarError):
            raise outcome
        return outcome


def refusal(error: str) -> str:
    """llguidance's error on one line, as a 400's message."""
    text = " ".join(line.strip() for line in error.strip().splitlines() if line.strip())
    return (text or "the constraint was refused")[:500]
