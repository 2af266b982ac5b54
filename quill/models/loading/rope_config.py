"""A Hugging Face config.json's rotary position settings, as transformers 4 and 5 write them: read by every
family with RoPE (hf_families.py) and by LFM2's own config reader (lfm2.py)."""

from __future__ import annotations


def read_rope(raw: dict) -> tuple[float, dict | None]:
    """(theta, rescaling or None) from rope_parameters (transformers 5) or rope_scaling + rope_theta (4.x)."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None) or raw.get("rope_theta", 10000.0)
    partial = params.pop("partial_rotary_factor", None) or raw.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ValueError(f"partial rotary embeddings (partial_rotary_factor {partial}) are not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    return float(theta), params if kind != "default" else None
