"""HTTP routes, one blueprint per concern."""

from izh_trio.frontend.routes.completions import bp as completions_bp
from izh_trio.frontend.routes.meta import bp as meta_bp

BLUEPRINTS = (completions_bp, meta_bp)
