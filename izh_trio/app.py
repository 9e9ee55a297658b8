"""``hypercorn -k trio izh_trio.app:app``: the app, configured from ``IZH_*`` variables."""

from izh_trio.frontend.app import create_app
from izh_trio.frontend.settings import Settings

app = create_app(Settings.from_env())
