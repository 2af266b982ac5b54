"""`quill bench`: a load generator for a running Quill server, with its report and plots.

workload (what is sent) -> runner (sending it, timing every chunk) -> report (figures, JSON)
-> plots (PNGs); context_sweep (decode latency against context length); baseline* (the same
workload in-process: Quill's engine and transformers generate()). cli wires them together.
"""
