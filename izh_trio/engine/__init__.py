"""The engine core process: model, paged KV cache, scheduler, sampler. Never imports trio."""
