"""What the endpoint picker scrapes, from a real server under load: a tiny Llama-shaped Transformer (K,V blocks)
with --max-num-seqs 2 and twice as many streams in flight, /metrics read every few milliseconds with
prometheus_client's text parser. Every metric the overlay's picker configuration names is there; waiting rises
above 0 while the batch is full and returns to 0; cache usage stays within [0, 1] and rises with load;
quill_cache_config_info's labels are the server's --block-size and the block count it logged, with the engine
on a thread or in a process of its own. Seconds each."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from quill.models.loading.saving import save_checkpoint
from tests.conftest import LiveServer, build_tiny_model
from tests.deploy.conftest import PICKER_CONFIG, picker_engine_config, picker_metrics

MAX_NUM_SEQS = 2
BLOCK_SIZE = 4
CACHE_BYTES = 256 * 2**10  # 256 blocks of this model's K,V (1 KiB each): two long streams fill about half
MAX_TOKENS = 240  # the model's context is 256 tokens
DEADLINE = 30.0  # seconds for the whole load; a tiny model on one CPU thread needs one or two


@pytest.fixture(scope="module")
def checkpoint(tiny_tokenizer, tmp_path_factory):
    arch, model = build_tiny_model("transformer-llama", tiny_tokenizer.vocab_size, device="cpu")
    path = save_checkpoint(tmp_path_factory.mktemp("llama") / "tiny-llama", arch, model, tiny_tokenizer,
                           dtype=model.embed.weight.dtype)
    return str(path), model.config


def serve(path: str, *extra: str) -> LiveServer:
    return LiveServer({"tiny-llama": path}, "--max-num-seqs", str(MAX_NUM_SEQS), "--cache-bytes", str(CACHE_BYTES),
                      "--block-size", str(BLOCK_SIZE), *extra)


@pytest.fixture(scope="module")
def server(checkpoint):
    path, config = checkpoint
    with serve(path) as live:
        yield live, config


def scrape(client: httpx.Client) -> dict:
    """Metric family name -> its samples' (labels, value), for the one model."""
    text = client.get("/metrics").text
    return {f.name: [(s.labels, s.value) for s in f.samples if s.labels.get("model") == "tiny-llama"]
            for f in text_string_to_metric_families(text)}


def gauge(metrics: dict, name: str) -> float:
    ((_, value),) = metrics[name]
    return value


def test_every_metric_the_picker_reads_is_served(server):
    live, _ = server
    engine = picker_engine_config(yaml.safe_load(PICKER_CONFIG.read_text()))
    with httpx.Client(base_url=live.url) as client:
        metrics = scrape(client)
    for key, (name, matchers) in picker_metrics(engine).items():
        assert any(matchers.items() <= labels.items() for labels, _ in metrics.get(name, [])), (key, name)
    ((labels, value),) = metrics[picker_metrics(engine)["cacheInfoSpec"][0]]
    assert value == 1
    assert {engine["cacheBlockSizeLabelName"], engine["cacheNumBlocksLabelName"]} <= set(labels)


def test_cache_config_info_is_the_servers_configuration(server):
    live, config = server
    with httpx.Client(base_url=live.url) as client:
        ((labels, _),) = scrape(client)["quill_cache_config_info"]
    assert labels["block_size"] == str(BLOCK_SIZE)
    (tokens,) = re.findall(rf"(\d+) tokens of K,V in blocks of {BLOCK_SIZE}\b", live.output())  # the load log's
    assert labels["num_gpu_blocks"] == str(int(tokens) // BLOCK_SIZE)
    bytes_per_block = 2 * config.n_layers * config.n_kv_heads * config.head_dim * BLOCK_SIZE * 4  # K and V, float32
    assert labels["num_gpu_blocks"] == str(CACHE_BYTES // bytes_per_block)
    assert labels["enable_prefix_caching"] == "True"


def test_cache_config_info_from_an_engine_process(server, checkpoint):
    """The engine in a process of its own (the default on CUDA) tells the API process the same."""
    live, _ = server
    with httpx.Client(base_url=live.url) as client:
        ((in_thread, _),) = scrape(client)["quill_cache_config_info"]
    with serve(checkpoint[0], "--engine-process") as separate, httpx.Client(base_url=separate.url) as client:
        ((in_process, _),) = scrape(client)["quill_cache_config_info"]
    assert in_process == in_thread


def stream(url: str, errors: list) -> None:
    body = {"prompt": "To be", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
    try:
        with httpx.Client(base_url=url, timeout=DEADLINE) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                for _ in response.iter_lines():
                    pass
    except BaseException as e:  # reported by the test, not lost in a thread
        errors.append(e)


def test_gauges_follow_the_load(server):
    live, _ = server
    errors: list = []
    threads = [threading.Thread(target=stream, args=(live.url, errors)) for _ in range(2 * MAX_NUM_SEQS)]
    seen = []  # (waiting, running, usage) per scrape
    with httpx.Client(base_url=live.url) as client:
        idle = scrape(client)
        assert (gauge(idle, "quill_num_requests_waiting"), gauge(idle, "quill_cache_usage_ratio")) == (0, 0)
        for t in threads:
            t.start()
        deadline = time.monotonic() + DEADLINE
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            m = scrape(client)
            seen.append(tuple(gauge(m, name) for name in
                              ("quill_num_requests_waiting", "quill_num_requests_running", "quill_cache_usage_ratio")))
            time.sleep(0.005)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not errors and not any(t.is_alive() for t in threads)
        settled = time.monotonic() + 5  # the gauges are the engine's last snapshot: the step after the last answer
        while True:
            after = scrape(client)
            idle_again = (gauge(after, "quill_num_requests_waiting"), gauge(after, "quill_num_requests_running"),
                          gauge(after, "quill_cache_usage_ratio")) == (0, 0, 0)
            if idle_again or time.monotonic() > settled:
                break
            time.sleep(0.05)
    waiting, running, usage = zip(*seen)
    assert max(waiting) >= 1, "the batch was full: requests waited"
    assert max(running) == MAX_NUM_SEQS
    # from 0 idle to about half the blocks: two streams of ~240 tokens in 256 blocks of 4
    assert all(0 <= u <= 1 for u in usage) and 0.3 < max(usage) <= 0.6
    assert (gauge(after, "quill_num_requests_waiting"), gauge(after, "quill_num_requests_running"),
            gauge(after, "quill_cache_usage_ratio")) == (0, 0, 0)
