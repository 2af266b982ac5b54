"""What the API process and the engine process say to each other, as typed messages (wire.py carries them).

Down: `AddRequest`, `AbortRequest`, `Stop`. Up: `Ready` or `Failed` once, then one `StepOutputs` per step.
Each message is a msgspec Struct encoded as an array whose first element is its `MessageKind`; a reader
decodes a frame straight into the message's type, checked against its fields. A refused request comes up
as a `Refusal` (its exception's kind and message) and is raised as the same exception type on this side.
"""

from __future__ import annotations

import enum

import msgspec

from quill.server.sampling import SamplingParams

from ..core import EngineStats
from ..outputs import RequestOutput
from ..scheduler import QueueFullError


class MessageKind(enum.IntEnum):
    """Which message a frame holds: the first element of its array on the wire."""

    ADD = 1
    ABORT = 2
    STOP = 3
    READY = 4
    FAILED = 5
    STEP = 6


class Message(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    @property
    def kind(self) -> MessageKind:
        return MessageKind(self.__struct_config__.tag)


# ---- down: the API process to the engine process --------------------------------------------------


class AddRequest(Message, tag=int(MessageKind.ADD)):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # its __post_init__ checks it again on arrival


class AbortRequest(Message, tag=int(MessageKind.ABORT)):
    request_id: str


class Stop(Message, tag=int(MessageKind.STOP)):
    """Every message before it is applied first; then the engine process exits."""


# ---- up: the engine process to the API process ----------------------------------------------------


class CoreInfo(msgspec.Struct, array_like=True, gc=False):
    """What the API process learns from a loaded core: where it runs and what it reserved."""

    device: str
    dtype: str
    cache_bytes: int
    cache_description: str
    num_kv_blocks: int | None  # None: the model keeps no K,V blocks


class Ready(Message, tag=int(MessageKind.READY)):
    info: CoreInfo


class Failed(Message, tag=int(MessageKind.FAILED)):
    """The model could not be loaded, or (after Ready) the engine lost its device; `reason` says why."""

    reason: str


class RefusalKind(enum.IntEnum):
    QUEUE_FULL = 1  # QueueFullError
    INVALID = 2  # ValueError: a request the core cannot take


REFUSAL_ERRORS: dict[RefusalKind, type[Exception]] = {RefusalKind.QUEUE_FULL: QueueFullError,
                                                      RefusalKind.INVALID: ValueError}


class Refusal(msgspec.Struct, array_like=True, gc=False):
    """A request `add_request` refused, as the exception its stream raises."""

    request_id: str
    kind: RefusalKind
    message: str

    @classmethod
    def of(cls, request_id: str, error: Exception) -> Refusal:
        kind = RefusalKind.QUEUE_FULL if isinstance(error, QueueFullError) else RefusalKind.INVALID
        return cls(request_id, kind, str(error))

    def error(self) -> Exception:
        return REFUSAL_ERRORS[self.kind](self.message)


class StepOutputs(Message, tag=int(MessageKind.STEP)):
    """Every request's output of one step (or of applying requests without a step) and the core's state."""

    outputs: list[RequestOutput]
    stats: EngineStats
    num_adds: int  # AddRequests received so far: those sent since are not yet in `stats.num_waiting`
    refusals: list[Refusal] = []


DOWN = AddRequest | AbortRequest | Stop
UP = Ready | Failed | StepOutputs
