"""KV-cache eviction: the policies (one small class each) live in `analysis.kv.policies`; the runner,
task, metrics and CLI in `analysis.kv_eviction`, which re-exports the policies."""
