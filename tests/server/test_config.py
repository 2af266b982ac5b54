"""`quill serve` flags that map onto engine and server settings."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from quill.server.config import ServerConfig, add_serve_arguments, config_from_args
from quill.server.serve import serve


def parse(*argv: str):
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return config_from_args(p.parse_args(list(argv)))


def test_enforce_eager_is_off_unless_asked():
    assert parse().enforce_eager is False  # graphs on CUDA; the CPU never captures any
    assert parse("--enforce-eager").enforce_eager is True


def test_async_scheduling_is_left_to_the_engine_unless_asked():
    assert parse().async_scheduling is None  # the engine decides by its model's device
    assert parse("--async-scheduling").async_scheduling is True
    assert parse("--no-async-scheduling").async_scheduling is False


def test_tensor_parallel_is_one_device_whose_ranks_the_server_starts_unless_asked(monkeypatch):
    assert (parse().tensor_parallel_size, parse().tensor_parallel_workers) == (1, "spawn")
    config = parse("--tensor-parallel-size", "2", "--tensor-parallel-workers", "external")
    assert (config.tensor_parallel_size, config.tensor_parallel_workers) == (2, "external")
    monkeypatch.setenv("QUILL_TENSOR_PARALLEL_SIZE", "4")
    assert parse().tensor_parallel_size == 4
    with pytest.raises(SystemExit):
        parse("--tensor-parallel-workers", "threads")


def test_event_loop_and_http_parser_default_to_the_fastest_installed():
    config = parse()
    assert (config.loop, config.http) == ("auto", "auto")
    config = parse("--loop", "asyncio", "--http", "h11")
    assert (config.loop, config.http) == ("asyncio", "h11")


def test_an_unknown_event_loop_is_refused():
    with pytest.raises(SystemExit):
        parse("--loop", "trio")
    with pytest.raises(ValueError, match="loop must be one of"):
        ServerConfig(loop="trio")


def test_tool_call_parser_is_found_from_templates_unless_named(monkeypatch):
    assert parse().tool_call_parser is None
    assert parse("--tool-call-parser", "hermes").tool_call_parser == "hermes"
    monkeypatch.setenv("QUILL_TOOL_CALL_PARSER", "mistral")
    assert parse().tool_call_parser == "mistral"
    with pytest.raises(SystemExit):
        parse("--tool-call-parser", "pythonic")
    with pytest.raises(ValueError, match="tool_call_parser must be one of"):
        ServerConfig(tool_call_parser="pythonic")


def test_a_missing_event_loop_is_named(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="uvloop is not installed"):
        serve(ServerConfig(loop="uvloop"))
