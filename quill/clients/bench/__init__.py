"""`quill bench`: a load generator for a running Quill server, over HTTP only, with its report and plots.

workload (what is sent; also what benchmarks/ replays in-process) -> runner (sending it, timing
every chunk) -> report (figures, JSON) -> plots (PNGs); context_sweep (decode latency against
context length); target (the server under test). cli wires them together. Nothing here imports
the server, the models, torch or transformers: in-process baselines live in benchmarks/.
"""
