"""KV-cache eviction: which cached tokens each policy keeps, step by step, and what it costs (components/views/kv.py)."""
from components.views.kv import KvView

KvView().render()
