"""HTTP routes, one blueprint per concern."""

from izh_trio.frontend.routes.chat import bp as chat_bp
from izh_trio.frontend.routes.completions import bp as completions_bp
from izh_trio.frontend.routes.lora import bp as lora_bp
from izh_trio.frontend.routes.meta import bp as meta_bp
from izh_trio.frontend.routes.tokenize import bp as tokenize_bp

BLUEPRINTS = (completions_bp, chat_bp, meta_bp, tokenize_bp, lora_bp)
