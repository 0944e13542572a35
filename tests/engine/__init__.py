"""The model loop in process: scheduler, sampler, batching, prefix cache."""
