"""KV-cache events as vLLM publishes them, for prefix-aware routers: a subscriber decodes them with a schema written
here from vLLM's format (not Quill's structs), rebuilds from them exactly the keys the prefix cache holds, sees
consecutive sequence numbers, gets what it missed from the replay socket; a failed step's batch ends with what the
reset took back; the stream opens and closes with AllBlocksCleared; the events come out of an engine process too."""

from __future__ import annotations

import hashlib
import shutil
import struct
import tempfile
import time

import httpx
import msgspec
import pytest
import zmq

from quill.server.config import add_serve_arguments, config_from_args
from quill.server.engine.kv_events import KVEventsConfig
from quill.server.engine.kv_events.config import binds
from quill.server.engine.process.core_loop import CoreLoop
from quill.server.hosting import kv_events_for
from quill.server.sampling import SamplingParams
from tests.conftest import LiveServer, free_port
from tests.server.engine.helpers import run_to_completion, scripted_engine


# ---- vLLM's format (vllm/distributed/kv_events.py), positional arrays as llm-d decodes them -----------------------

class Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemoved(Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(Event):
    pass


class Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


decode = msgspec.msgpack.Decoder(Batch).decode
END = (-1).to_bytes(8, "big", signed=True)
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SHARED = [5, 6, 7, 8, 9, 10, 11, 12]  # two blocks of 4 every prompt starts with


@pytest.fixture
def endpoints():
    """(publisher, replay) as ipc:// paths: bound, local, no port to collide on (short: a socket path's limit)."""
    folder = tempfile.mkdtemp(prefix="kv", dir="/tmp")
    yield f"ipc://{folder}/pub", f"ipc://{folder}/replay"
    shutil.rmtree(folder, ignore_errors=True)


def events_engine(tiny_tokenizer, endpoints, state_kind="paged_kv", buffer_steps=10_000, **kwargs):
    config = KVEventsConfig(endpoints[0], endpoints[1], topic="kv@test@scripted", buffer_steps=buffer_steps)
    kwargs = dict(block_size=4, num_blocks=24, max_num_seqs=4, budget=32) | kwargs
    return scripted_engine(tiny_tokenizer, state_kind=state_kind, kv_events=config, **kwargs)


def kv_manager(engine):
    return engine.cache.kv if hasattr(engine.cache, "kv") else engine.cache


def held_hashes(engine) -> set[int]:
    """The prefix cache's keys as published: the last 8 bytes of each SHA-256 key, read big-endian."""
    return {int.from_bytes(key[-8:], "big") for key in kv_manager(engine).cached}


def run_rounds(engine, rounds: int = 3) -> None:
    """Rounds of 4 prompts sharing their first two blocks, each round run to completion: later rounds hit the shared
    prefix, and the 24 blocks run out, so cached blocks are reused (evicted)."""
    for r in range(rounds):
        for i in range(4):
            engine.add_request(f"r{r}-{i}", SHARED + [20 + 4 * r + i, 21, 22, 23, 24 + i], PARAMS)
        run_to_completion(engine)


def replay(endpoint: str, start: int, timeout_ms: int = 5000) -> list[tuple[int, bytes]]:
    """Ask the replay socket for the batches from `start` on, as a DEALER (which adds REQ's empty frame itself)."""
    with zmq.Context.instance().socket(zmq.DEALER) as sock:
        sock.connect(endpoint)
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while sock.poll(timeout_ms):
            empty, seq, payload = sock.recv_multipart()
            assert empty == b""
            if seq == END:
                assert payload == b""
                return out
            out.append((int.from_bytes(seq, "big"), payload))
    raise AssertionError(f"no end of replay after {out and out[-1][0]}")


def subscriber(endpoint: str, topic: str = "") -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sock.connect(endpoint)
    return sock


def receive(sock: zmq.Socket, until_seq: int | None = None, timeout_ms: int = 5000) -> list[tuple[bytes, int, bytes]]:
    """(topic, sequence number, payload) of each message, until `until_seq` arrives (None: until none comes for
    0.3 s)."""
    out = []
    while sock.poll(timeout_ms if until_seq is not None else 300):
        topic, seq, payload = sock.recv_multipart()
        out.append((topic, int.from_bytes(seq, "big"), payload))
        if until_seq is not None and out[-1][1] >= until_seq:
            break
    return out


def connect_and_wait(sock: zmq.Socket, engine, prompt: list[int]) -> list[tuple[bytes, int, bytes]]:
    """Run a request at a time until the subscriber receives a batch: its subscription is then in place (ZMQ drops
    what a PUB socket sends before)."""
    for attempt in range(50):
        engine.add_request(f"warm-{attempt}", prompt + [40 + attempt] * 4, PARAMS)
        run_to_completion(engine)
        got = receive(sock, timeout_ms=0)
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("the subscriber never received a batch")


def rebuild(batches: list[Batch]) -> set[int]:
    """The hashes a router holds after applying every event in order; each removal removes a held hash, no hash
    is stored twice."""
    held: set[int] = set()
    for batch in batches:
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert held.isdisjoint(event.block_hashes)
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert held.issuperset(event.block_hashes)
                held.difference_update(event.block_hashes)
            else:
                held.clear()
    return held


def check_hashes_from_tokens(batches: list[Batch]) -> None:
    """Every stored hash is what docs/serving.md tells an indexer to compute from the token ids: SHA-256 of the
    parent's 32-byte key (zeros for the first block) and the block's tokens as 4-byte little-endian integers, the
    published hash the key's last 8 bytes, big-endian."""
    full = {}  # published hash -> the 32-byte key behind it
    for batch in batches:
        for event in batch.events:
            if not isinstance(event, BlockStored):
                continue
            size = event.block_size
            parent = bytes(32) if event.parent_block_hash is None else full[event.parent_block_hash]
            assert len(event.token_ids) == size * len(event.block_hashes)
            for i, published in enumerate(event.block_hashes):
                tokens = event.token_ids[i * size : (i + 1) * size]
                parent = hashlib.sha256(parent + struct.pack(f"<{size}I", *tokens)).digest()
                assert published == int.from_bytes(parent[-8:], "big")
                full[published] = parent


@pytest.mark.parametrize("state_kind, overlap", [("paged_kv", False), ("paged_kv", True), ("hybrid", False)])
def test_replaying_every_batch_rebuilds_the_prefix_cache(tiny_tokenizer, endpoints, state_kind, overlap):
    engine = events_engine(tiny_tokenizer, endpoints, state_kind, async_scheduling=overlap)
    try:
        run_rounds(engine)
        replayed = replay(endpoints[1], 0)
        assert [seq for seq, _ in replayed] == list(range(len(replayed)))
        batches = [decode(payload) for _, payload in replayed]
        assert batches[0].events == [AllBlocksCleared()]  # the stream opens on an empty cache
        assert all(batch.data_parallel_rank == 0 and batch.events for batch in batches)
        stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
        assert stored and all(e.block_size == 4 and e.medium == "GPU" and e.lora_id is None for e in stored)
        assert any(isinstance(e, BlockRemoved) for b in batches for e in b.events), "no block was evicted"
        assert kv_manager(engine).prefix_hits > 0
        assert rebuild(batches) == held_hashes(engine)
        check_hashes_from_tokens(batches)
    finally:
        engine.close()


def test_a_subscriber_sees_consecutive_sequence_numbers(tiny_tokenizer, endpoints):
    engine = events_engine(tiny_tokenizer, endpoints)
    sock = subscriber(endpoints[0], "kv@test")
    try:
        first = connect_and_wait(sock, engine, [1, 2, 3, 4])
        run_rounds(engine)
        last = replay(endpoints[1], 0)[-1][0]
        received = first + receive(sock, until_seq=last)
        seqs = [seq for _, seq, _ in received]
        assert seqs == list(range(seqs[0], last + 1))
        assert {topic for topic, _, _ in received} == {b"kv@test@scripted"}
        assert {seq: payload for _, seq, payload in received}.items() <= dict(replay(endpoints[1], seqs[0])).items()
    finally:
        sock.close(linger=0)
        engine.close()


def test_the_replay_socket_returns_what_a_subscriber_missed(tiny_tokenizer, endpoints):
    engine = events_engine(tiny_tokenizer, endpoints, buffer_steps=5)
    try:
        run_rounds(engine, rounds=1)
        kept = replay(endpoints[1], 0)
        assert len(kept) == 5 and [seq for seq, _ in kept] == list(range(kept[0][0], kept[0][0] + 5))
        missed_from = kept[-1][0] + 1
        run_rounds(engine, rounds=1)  # a subscriber that last saw `missed_from - 1` asks for the rest
        with zmq.Context.instance().socket(zmq.DEALER) as bad:  # a malformed request is ignored, nothing breaks
            bad.connect(endpoints[1])
            bad.send_multipart([b"", b"\x01"])
            assert not bad.poll(200)
        missed = replay(endpoints[1], missed_from)
        assert missed and missed[0][0] == missed_from
        assert replay(endpoints[1], missed[-1][0] + 1) == []  # nothing past the last: only the end marker
    finally:
        engine.close()


def test_a_failed_step_publishes_what_it_stored_then_what_the_reset_took_back(tiny_tokenizer, endpoints,
                                                                              monkeypatch):
    # Blocks of one token: every step keys a block per sequence. With a step in flight, the step that faults had
    # its blocks keyed before its results were waited for: the reset takes those keys back.
    engine = events_engine(tiny_tokenizer, endpoints, block_size=1, num_blocks=256, async_scheduling=True)
    loop = CoreLoop(engine)
    try:
        for request_id in ("a", "b"):
            assert loop.add(request_id, [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True)) is None
        while engine.num_overlapped_steps < 3:
            loop.step()
        real_launch = engine.runner.launch

        def fault(host):  # as a device fault surfaces: when the step's results are waited for
            raise RuntimeError("device fault")

        def faulty_launch(*args, **kwargs):
            pending = real_launch(*args, **kwargs)
            pending.build = fault
            return pending

        monkeypatch.setattr(engine.runner, "launch", faulty_launch)
        loop.step()
        before = len(replay(endpoints[1], 0))
        failed = dict(loop.step())
        assert set(failed) == {"a", "b"}
        batches = [decode(payload) for _, payload in replay(endpoints[1], 0)]
        last = batches[-1].events
        assert len(batches) == before + 1
        stored = {h for e in last if isinstance(e, BlockStored) for h in e.block_hashes}
        taken_back = {h for e in last if isinstance(e, BlockRemoved) for h in e.block_hashes}
        assert stored and stored <= taken_back  # the failed step's keys: stored, then taken back
        assert rebuild(batches) == held_hashes(engine)
        monkeypatch.setattr(engine.runner, "launch", real_launch)
        loop.add("c", [1, 2, 3, 4, 5], SamplingParams(max_tokens=5, ignore_eos=True))
        while engine.has_work():
            loop.step()
        assert rebuild([decode(payload) for _, payload in replay(endpoints[1], 0)]) == held_hashes(engine)
    finally:
        engine.close()


def test_closing_the_engine_publishes_all_blocks_cleared(tiny_tokenizer, endpoints):
    engine = events_engine(tiny_tokenizer, endpoints)
    sock = subscriber(endpoints[0])
    try:
        connect_and_wait(sock, engine, SHARED)
        engine.close()
        [(_, _, payload)] = receive(sock)
        assert decode(payload).events == [AllBlocksCleared()]
    finally:
        sock.close(linger=0)
        engine.close()


def test_a_model_without_k_v_blocks_publishes_nothing(tiny_tokenizer, endpoints):
    engine = events_engine(tiny_tokenizer, endpoints, state_kind="slots")
    assert engine.kv_events is None
    run_rounds(engine, rounds=1)
    engine.close()


def test_flags_give_each_hosted_model_its_own_endpoints():
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    config = config_from_args(parser.parse_args([
        "--kv-events-endpoint", "tcp://*:5557", "--kv-events-replay-endpoint", "tcp://*:5558",
        "--kv-events-topic", "kv@pod-1@{model}", "--kv-events-buffer-steps", "100"]))
    first, second = kv_events_for(config, 0, "llama"), kv_events_for(config, 1, "qwen")
    assert (first.endpoint, first.replay_endpoint, first.topic, first.buffer_steps) == (
        "tcp://*:5557", "tcp://*:5558", "kv@pod-1@llama", 100)
    assert (second.endpoint, second.replay_endpoint, second.topic) == ("tcp://*:5558", "tcp://*:5559", "kv@pod-1@qwen")
    assert kv_events_for(config_from_args(parser.parse_args([])), 0, "llama") is None
    assert KVEventsConfig("ipc:///tmp/kv").for_model(2, "m").endpoint == "ipc:///tmp/kv-2"
    assert binds("tcp://*:5557") and binds("ipc:///tmp/kv") and not binds("tcp://indexer:5557")
    with pytest.raises(ValueError, match="needs --kv-events-endpoint"):
        config_from_args(parser.parse_args(["--kv-events-replay-endpoint", "tcp://*:5558"]))


def test_an_engine_process_publishes_its_events(tiny_checkpoints):
    pub, replay_port = free_port(), free_port()
    model = {"tiny-transformer": tiny_checkpoints["tiny-transformer"]}
    with LiveServer(model, "--engine-process", "--kv-events-endpoint", f"tcp://*:{pub}",
                    "--kv-events-replay-endpoint", f"tcp://*:{replay_port}", "--kv-events-topic", "kv@pod@{model}",
                    ) as server:
        sock = subscriber(f"tcp://127.0.0.1:{pub}", "kv@pod@tiny-transformer")
        try:
            received = []
            for attempt in range(40):  # until the subscription is in place
                response = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
                    "prompt": "To be or not to be, that is the question", "max_tokens": 4})
                assert response.status_code == 200
                received += receive(sock, timeout_ms=200)
                if received:
                    break
            assert {topic for topic, _, _ in received} == {b"kv@pod@tiny-transformer"}
            replayed = replay(f"tcp://127.0.0.1:{replay_port}", 0)
            batches = [decode(payload) for _, payload in replayed]
            assert batches[0].events == [AllBlocksCleared()]
            assert any(isinstance(e, BlockStored) for b in batches for e in b.events)
            assert dict(replayed)[received[0][1]] == received[0][2]
            check_hashes_from_tokens(batches)
        finally:
            sock.close(linger=0)
        assert "tiny-transformer: publishing KV-cache events" in server.output()
