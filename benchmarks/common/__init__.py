"""What the benchmarks share: the models they build and load (checkpoints.py, hf_models.py), how they run Quill and
transformers and time them (quill_runs.py, hf_runs.py, timing.py, server_process.py), the machine's description
(hardware.py), their settings, and their reports. Nothing here runs on its own: the benchmarks are the modules one
level up (`python -m benchmarks.<name>`)."""
