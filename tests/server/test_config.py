"""`quill serve` flags that map onto engine settings."""

from __future__ import annotations

import argparse

from server.config import add_serve_arguments, config_from_args


def parse(*argv: str):
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return config_from_args(p.parse_args(list(argv)))


def test_enforce_eager_is_off_unless_asked():
    assert parse().enforce_eager is False  # graphs on CUDA; the CPU never captures any
    assert parse("--enforce-eager").enforce_eager is True


def test_async_scheduling_is_off_unless_asked():
    assert parse().async_scheduling is False
    assert parse("--async-scheduling").async_scheduling is True
