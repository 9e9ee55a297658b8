"""The HTTP frontend process: trio, quart-trio and the engine client. Never imports torch."""
