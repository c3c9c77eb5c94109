"""Talk: what a model forgets when its memory of the prompt is cut to a fixed size (the KV-cache page)."""
from analysis.talks import Step, Talk

TALK = Talk(
    "kv-cache", "What a small memory forgets",
    "A model keeps a note of every word it has read; these steps cut that memory to a fixed size and watch "
    "what each way of choosing what to keep gets wrong.",
    steps=(
        Step("kv-cache", "needle-streaming", "Keep only the newest words",
             "When the model keeps only its first few and its newest words, the one fact it was asked about is "
             "gone and it answers wrong.", "kv.accuracy"),
        Step("kv-cache", "morphkv", "A long answer in a small memory",
             "MorphKV writes a long answer while its memory stays the same small size, and the full memory grows "
             "almost three times larger.", "kv.cache_kib"),
        Step("kv-cache", "morphkv-loses", "Where MorphKV loses",
             "On another picture the same rule keeps only a quarter of the facts, fewer than the simpler rules "
             "beside it.", "kv.recall"),
        Step("kv-cache", "real-recall", "A real model forgets where Mia lives",
             "A real chat model that keeps only its newest words forgets the city it was told, while the rules "
             "that keep the words it looked at answer right.", "kv.accuracy"),
    ),
)
