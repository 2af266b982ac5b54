"""The base of every request body and of every object inside one: a field it does not declare is refused,
never dropped, so `"max_tokns": 5` is a 400 naming it (as OpenAI answers) instead of a request run with
the default. Fields real clients send that change nothing Quill generates are declared, and documented
as accepted and ignored, in each dialect's schema.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RequestSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
