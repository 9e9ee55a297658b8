"""The only code both processes import: messages, sampling parameters and the frame codec."""

from izh_trio.wire.codec import FrameDecoder, ProtocolError, encode_frame
from izh_trio.wire.messages import (
    Abort,
    AddRequest,
    EngineConfig,
    Fatal,
    FinishReason,
    FromCore,
    Message,
    ModelInfo,
    Ready,
    RequestFailed,
    RequestOutput,
    Shutdown,
    Stats,
    StepOutputs,
    ToCore,
    TokenLogprobs,
)
from izh_trio.wire.sampling import SamplingParams

__all__ = [
    "Abort",
    "AddRequest",
    "EngineConfig",
    "Fatal",
    "FinishReason",
    "FrameDecoder",
    "FromCore",
    "Message",
    "ModelInfo",
    "ProtocolError",
    "Ready",
    "RequestFailed",
    "RequestOutput",
    "SamplingParams",
    "Shutdown",
    "Stats",
    "StepOutputs",
    "ToCore",
    "TokenLogprobs",
    "encode_frame",
]
