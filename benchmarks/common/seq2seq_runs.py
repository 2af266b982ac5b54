"""The seq2seq benchmark's baselines, transformers `generate()` and CTranslate2, offline and online, and what the
online runs of every engine share (Poisson arrivals, latency percentiles, throughput at a latency budget).

Every engine generates exactly `new_tokens` tokens per source, end token never counted: transformers with
`min_new_tokens == max_new_tokens`; CTranslate2 with `min_decoding_length == max_decoding_length`, which counts the
same way (`min_decoding_length=k` bars the end token for the first k tokens, as `min_new_tokens` does; at the limit
no end token is appended, even with `return_end_token`). A run that returns another length is an error.

On the same float32 weights the two give the same greedy tokens. Beam search may keep different beams: while the end
token is barred, CTranslate2 scores beams with log-probabilities renormalized over the tokens left (and without <pad>,
which its converter drops from Marian's vocabulary), transformers with the full softmax's, masked afterwards.
"""

from __future__ import annotations

import math
import queue
import random
import threading
import time
from dataclasses import dataclass

import torch

from .marian_shape import Vocab


@dataclass(slots=True)
class Offline:
    """Sources translated, start of the first to end of the last."""

    engine: str
    beams: int
    sentences: int
    generated_tokens: int
    seconds: float

    def to_dict(self, **extra) -> dict:
        return {"engine": self.engine, "beams": self.beams, "sentences": self.sentences,
                "generated_tokens": self.generated_tokens, "seconds": self.seconds,
                "tokens_per_s": self.generated_tokens / self.seconds,
                "sentences_per_s": self.sentences / self.seconds, **extra}


def _check_lengths(engine: str, outputs: list[list[int]], new_tokens: int) -> None:
    wrong = [len(o) for o in outputs if len(o) != new_tokens]
    if wrong:
        raise RuntimeError(f"{engine} returned {len(wrong)} outputs of other lengths than {new_tokens} "
                           f"(e.g. {wrong[0]})")


# transformers


def load_transformers(hf_dir, device: str = "cpu", dtype: torch.dtype = torch.float32):
    from transformers import MarianMTModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # "max_new_tokens and max_length both set": max_new_tokens wins, as meant
    return MarianMTModel.from_pretrained(hf_dir, dtype=dtype).to(device).eval()


@torch.inference_mode()
def transformers_batch(model, batch: list[list[int]], new_tokens: int, beams: int) -> list[list[int]]:
    """One right-padded batch (as MarianTokenizer pads) through `generate()`; the new tokens of each source."""
    pad = model.config.pad_token_id
    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, source in enumerate(batch):
        ids[row, :len(source)] = torch.tensor(source)
        mask[row, :len(source)] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         num_beams=beams, num_return_sequences=1, do_sample=False)
    return out[:, 1:].tolist()  # after the decoder start token (<pad>)


def transformers_offline(model, sources: list[list[int]], new_tokens: int, beams: int, batch_size: int,
                         ) -> tuple[Offline, list[list[int]]]:
    """Static batches of `batch_size` in the sources' order, one after the other, after an untimed warm-up."""
    transformers_batch(model, sources[:2], 2, beams)
    start = time.perf_counter()
    outputs = []
    for i in range(0, len(sources), batch_size):
        outputs += transformers_batch(model, sources[i:i + batch_size], new_tokens, beams)
    seconds = time.perf_counter() - start
    _check_lengths("transformers", outputs, new_tokens)
    return Offline("transformers", beams, len(sources), sum(map(len, outputs)), seconds), outputs


# CTranslate2


def ctranslate2_translator(ct2_dir, threads: int, device: str = "cpu", compute_type: str = "float32"):
    import ctranslate2

    return ctranslate2.Translator(str(ct2_dir), device=device, compute_type=compute_type, intra_threads=threads,
                                  inter_threads=1)


def ctranslate2_batch(translator, vocab: Vocab, pieces: list[list[str]], new_tokens: int, beams: int,
                      max_batch_size: int) -> list[list[int]]:
    results = translator.translate_batch(pieces, max_batch_size=max_batch_size, beam_size=beams, num_hypotheses=1,
                                         min_decoding_length=new_tokens, max_decoding_length=new_tokens)
    return [vocab.to_ids(r.hypotheses[0]) for r in results]


def ctranslate2_offline(translator, vocab: Vocab, sources: list[list[int]], new_tokens: int, beams: int,
                        batch_size: int) -> tuple[Offline, list[list[int]]]:
    """All sources in one translate_batch call (it sorts them by length and runs `batch_size` at a time)."""
    pieces = [vocab.to_pieces(s) for s in sources]  # the tokenizer's work, outside the timing as for transformers
    ctranslate2_batch(translator, vocab, pieces[:2], 2, beams, batch_size)
    start = time.perf_counter()
    outputs = ctranslate2_batch(translator, vocab, pieces, new_tokens, beams, batch_size)
    seconds = time.perf_counter() - start
    _check_lengths("ctranslate2", outputs, new_tokens)
    return Offline("ctranslate2", beams, len(sources), sum(map(len, outputs)), seconds), outputs


# online: shared


def poisson_offsets(rate: float, count: int, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of `count` requests arriving as a Poisson process of `rate` per s."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between ranks; inf counts as a latency past every budget."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * q / 100
    low, high = math.floor(k), math.ceil(k)
    if math.isinf(ordered[high]):
        return ordered[high]
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def online_summary(engine: str, rate: float, arrivals: list[float], done: list[float | None], new_tokens: int,
                   **extra) -> dict:
    """Latency = done - arrival (perf_counter seconds); a request never done has an infinite latency. Throughput:
    finished sentences from the first arrival to the last completion."""
    finished = [d for d in done if d is not None]
    latencies = [math.inf if d is None else d - a for a, d in zip(arrivals, done)]
    span = (max(finished) - min(arrivals)) if finished else math.nan
    return {"engine": engine, "rate": rate, "requests": len(arrivals), "finished": len(finished),
            "seconds": span, "sentences_per_s": len(finished) / span if finished else 0.0,
            "tokens_per_s": len(finished) * new_tokens / span if finished else 0.0,
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99), **extra}


def throughput_within(runs: list[dict], budget: float) -> tuple[float, str]:
    """(sentences/s, how) an engine reaches with a p99 latency of at most `budget`, read off its sweep: the best
    rate that kept within it, linearly toward the first that did not. "" when read inside the sweep; "at least"
    when every rate kept within (more load was not tried); "below the sweep" when none did."""
    runs = sorted(runs, key=lambda r: r["rate"])
    within = [r for r in runs if r["p99_s"] <= budget]
    if not within:
        return 0.0, "below the sweep"
    best = max(within, key=lambda r: r["sentences_per_s"])
    after = [r for r in runs if r["rate"] > best["rate"] and r["p99_s"] > budget]
    if not after:
        return best["sentences_per_s"], "at least" if best is runs[-1] else ""
    nxt = after[0]
    if math.isinf(nxt["p99_s"]) or nxt["sentences_per_s"] <= best["sentences_per_s"]:
        return best["sentences_per_s"], ""
    f = (budget - best["p99_s"]) / (nxt["p99_s"] - best["p99_s"])
    return best["sentences_per_s"] + f * (nxt["sentences_per_s"] - best["sentences_per_s"]), ""


# online: CTranslate2 behind a micro-batching loop


class MicroBatcher:
    """A thread that takes the requests waiting in its queue, waits until `window` seconds after the oldest one's
    arrival for more (up to `max_batch`), translates them in one translate_batch call, and repeats."""

    def __init__(self, translator, vocab: Vocab, new_tokens: int, beams: int, window: float, max_batch: int):
        self.translator, self.vocab, self.new_tokens, self.beams = translator, vocab, new_tokens, beams
        self.window, self.max_batch = window, max_batch
        self.inbox: queue.Queue = queue.Queue()
        self.done: dict[int, float] = {}
        self.batches: list[int] = []
        self.error: BaseException | None = None
        self.stopping = False  # set when the caller stops waiting: the loop ends after its current batch
        self.thread = threading.Thread(target=self._loop, name="ct2-microbatcher", daemon=True)
        self.thread.start()

    def submit(self, index: int, pieces: list[str]) -> float:
        arrival = time.perf_counter()
        self.inbox.put((index, pieces, arrival))
        return arrival

    def close(self) -> None:
        self.inbox.put(None)

    def _loop(self) -> None:
        try:
            while (first := self.inbox.get()) is not None:
                batch, closing = [first], False
                while len(batch) < self.max_batch:
                    wait = first[2] + self.window - time.perf_counter()
                    try:
                        item = self.inbox.get_nowait() if wait <= 0 else self.inbox.get(timeout=wait)
                    except queue.Empty:
                        break
                    if item is None:
                        closing = True
                        break
                    batch.append(item)
                outputs = ctranslate2_batch(self.translator, self.vocab, [p for _, p, _ in batch], self.new_tokens,
                                            self.beams, self.max_batch)
                _check_lengths("ctranslate2", outputs, self.new_tokens)
                now = time.perf_counter()
                self.done.update((index, now) for index, _, _ in batch)
                self.batches.append(len(batch))
                if closing or self.stopping:
                    return
        except BaseException as e:  # reported by the caller, not lost in the thread
            self.error = e


def ctranslate2_online(translator, vocab: Vocab, sources: list[list[int]], offsets: list[float], new_tokens: int,
                       beams: int, window: float, max_batch: int, drain_cap: float, rate: float) -> dict:
    """Sources sent at `offsets` (seconds) to a MicroBatcher; waits for the last at most `drain_cap` seconds after
    the last arrival (requests still unanswered then count as never answered)."""
    pieces = [vocab.to_pieces(s) for s in sources]
    ctranslate2_batch(translator, vocab, pieces[:2], 2, beams, max_batch)  # warm-up
    batcher = MicroBatcher(translator, vocab, new_tokens, beams, window, max_batch)
    start, arrivals = time.perf_counter(), []
    for index, (p, offset) in enumerate(zip(pieces, offsets)):
        time.sleep(max(0.0, start + offset - time.perf_counter()))
        arrivals.append(batcher.submit(index, p))
    batcher.close()
    batcher.thread.join(timeout=drain_cap)
    batcher.stopping = True  # past the cap: no further batch, so nothing runs beside the next engine's turn
    batcher.thread.join()
    if batcher.error is not None:
        raise RuntimeError(f"the micro-batching loop failed: {batcher.error!r}") from batcher.error
    done = [batcher.done.get(i) for i in range(len(sources))]
    mean_batch = sum(batcher.batches) / len(batcher.batches) if batcher.batches else 0.0
    return online_summary("ctranslate2", rate, arrivals, done, new_tokens, mean_batch=mean_batch,
                          window_s=window, drain_cap_s=drain_cap)
