"""Each model family's tool-call syntax (``base.ToolFormat``), one module per format, and the
choice of one for a checkpoint (``choose``)."""

from izh_trio.frontend.tool_formats.base import OutputParser, ToolFormat
from izh_trio.frontend.tool_formats.choose import TOOL_CALL_PARSERS, choose_tool_format
from izh_trio.frontend.tool_formats.hermes import Hermes

#: The format of a plan made without a checkpoint at hand (Qwen3's, the embedded model's).
HERMES = Hermes()

__all__ = ["HERMES", "TOOL_CALL_PARSERS", "Hermes", "OutputParser", "ToolFormat",
           "choose_tool_format"]
