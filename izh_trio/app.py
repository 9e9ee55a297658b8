"""``hypercorn -k trio izh_trio.app:app``: the app, configured from ``IZH_*`` variables."""

import logging

from izh_trio.frontend.app import create_app
from izh_trio.frontend.settings import Settings
from izh_trio.wire import log_format

settings = Settings.from_env()
log_format.configure(settings.log_level, settings.log_format)
# hypercorn's CLI gives its own logger a handler and format of its own once it serves: its
# lines (the bind address, its errors) go through ours instead, in one format and only once.
logging.getLogger("hypercorn.error").addFilter(log_format.to_root_only)
app = create_app(settings)
