"""What a prefix-cache key costs per block: the SHA-256 chain (quill/server/engine/cache/prefix.py) beside the Python
`hash()` chain it replaced, and beside the keyed BLAKE2b it was chosen over.

    python -m benchmarks.prefix_keys                       # blocks of 16 and 64, a 4096-token prompt
    python -m benchmarks.prefix_keys --block-sizes 4 16 --tokens 8192 --runs 9 --out runs/prefix_keys.json

For each block size, every scheme keys the same prompt's full blocks, as `admit` does for a new prompt;
"key+lookup" also looks each key up in a dict that holds them all (as the cache does), since an old
(parent hash, tokens) key is hashed again by every lookup while a bytes key remembers its hash. Figures are
nanoseconds per block, the median of `--runs` runs, each long enough (>= 20 ms) to time. The default
block size, 16, is also the interval of LSTM / gated-CNN state snapshots (CacheConfig.block_size is both).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import secrets
import ssl
import statistics
import struct
import time
from typing import Callable

from quill.models.training.machine import available_cores, cpu_model_name
from quill.server.engine.cache.prefix import block_keys


def python_hash_keys(token_ids: list[int], block_size: int) -> list:
    """The old keys: (hash of the previous key, this block's tokens)."""
    keys, parent = [], 0
    for i in range(len(token_ids) // block_size):
        key = (parent, tuple(token_ids[i * block_size : (i + 1) * block_size]))
        keys.append(key)
        parent = hash(key)
    return keys


def keyed_blake2b_keys(token_ids: list[int], block_size: int, secret: bytes) -> list[bytes]:
    """The alternative: BLAKE2b keyed with a per-process secret, over the same bytes as the SHA-256 chain."""
    pack = struct.Struct(f"<{block_size}I").pack
    keys, parent = [], bytes(32)
    for i in range(len(token_ids) // block_size):
        parent = hashlib.blake2b(parent + pack(*token_ids[i * block_size : (i + 1) * block_size]),
                                 digest_size=32, key=secret).digest()
        keys.append(parent)
    return keys


def ns_per_block(make_keys: Callable[[], list], num_blocks: int, runs: int, lookup: bool) -> float:
    """Median over `runs` of the time to key (and look up) every block, per block."""
    table = dict.fromkeys(make_keys())

    def timed(repeats: int) -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            keys = make_keys()
            if lookup:
                for key in keys:
                    table[key]
        return time.perf_counter() - start

    repeats = 1
    while (first := timed(repeats)) < 0.02:  # enough repeats per run that one run lasts >= 20 ms
        repeats *= 2
    samples = [first] + [timed(repeats) for _ in range(runs - 1)]
    return 1e9 * statistics.median(samples) / (repeats * num_blocks)


def measure(block_size: int, num_tokens: int, runs: int, vocab_size: int) -> list[dict]:
    rng = random.Random(block_size)
    token_ids = [rng.randrange(vocab_size) for _ in range(num_tokens)]
    secret = secrets.token_bytes(32)
    schemes = {
        "python hash() chain (old)": lambda: python_hash_keys(token_ids, block_size),
        "SHA-256 chain (new)": lambda: block_keys(token_ids, block_size),
        "keyed BLAKE2b chain": lambda: keyed_blake2b_keys(token_ids, block_size, secret),
    }
    num_blocks = num_tokens // block_size
    return [{"block_size": block_size, "scheme": name,
             "key_ns": ns_per_block(make, num_blocks, runs, lookup=False),
             "key_lookup_ns": ns_per_block(make, num_blocks, runs, lookup=True)} for name, make in schemes.items()]


def describe_machine() -> dict:
    return {"cpu": cpu_model_name(), "cores": available_cores(), "python": platform.python_version(),
            "openssl": ssl.OPENSSL_VERSION, "load_average": [round(x, 2) for x in os.getloadavg()]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefix_keys", description=__doc__.split("\n")[0])
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 64], help="tokens per block")
    parser.add_argument("--tokens", type=int, default=4096, help="prompt length keyed per run")
    parser.add_argument("--runs", type=int, default=7, help="timed runs; the median is reported")
    parser.add_argument("--vocab-size", type=int, default=128_256, help="token ids are drawn below this")
    parser.add_argument("--out", help="also write the results as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = {"machine": describe_machine(), "tokens": args.tokens, "runs": args.runs, "rows": []}
    print(json.dumps(result["machine"]))
    print(f"{'block':>5}  {'scheme':<26} {'key ns/block':>12} {'vs old':>7} {'key+lookup ns':>13} {'vs old':>7}")
    for block_size in args.block_sizes:
        rows = measure(block_size, args.tokens, args.runs, args.vocab_size)
        old = rows[0]
        for row in rows:
            row["key_ratio"] = row["key_ns"] / old["key_ns"]
            row["key_lookup_ratio"] = row["key_lookup_ns"] / old["key_lookup_ns"]
            print(f"{block_size:>5}  {row['scheme']:<26} {row['key_ns']:>12.0f} {row['key_ratio']:>6.2f}x "
                  f"{row['key_lookup_ns']:>13.0f} {row['key_lookup_ratio']:>6.2f}x")
        result["rows"] += rows
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
