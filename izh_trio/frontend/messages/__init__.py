"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) on the serving
pipeline: a request translator, an output, and Anthropic's error shape."""
