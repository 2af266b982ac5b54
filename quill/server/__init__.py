"""The Quill server: engine, sampling, HTTP API and hosting."""

__version__ = "0.1.0"  # reported by /info and in the OpenAPI document; pyproject.toml carries the same
