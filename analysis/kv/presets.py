"""The KV-cache panel's presets: settings that show one finding of MorphKV's paper on the demo zoo
(analysis/framework/presets.py; tests/page/test_presets.py re-checks each sentence on the page)."""
from __future__ import annotations

from dataclasses import replace

from analysis.kv.params import KvParams
from analysis.framework.presets import REAL_MODEL, Preset, real_model_in_zoo

RETRIEVAL = KvParams(budget=32, seed=7)  # 189 context tokens, the needles at 64-65
LONG = KvParams(task="long-response", budget=48)
POSITIONS = {"layer": 0, "head": 0, "position_metric": "top1"}
STEPS = {"layer": 0, "head": 0, "metric": "accuracy"}

PRESETS = (
    Preset("needle-streaming", "StreamingLLM loses the needle",
           "Budget 32 of 189 context tokens, the asked needle at positions 64-65: StreamingLLM keeps only the "
           "4 sinks and the recent tokens, so the needle is gone from every head (survival 0) and the answer "
           "is wrong, while H2O and MorphKV answer right, like the full cache.",
           "zoo:shapes-lm", replace(RETRIEVAL, policy="streaming_llm"), STEPS),
    Preset("morphkv", "MorphKV: a long answer at constant memory",
           "shapes-lm decomposes a caption into 12 claims with every cache held at 48 entries: MorphKV's cache "
           "stays at 96 KiB while the full cache grows to 262 KiB, and its answer keeps 8 of the 12 claims "
           "where H2O and SnapKV keep 3 and StreamingLLM 4.",
           "zoo:shapes-lm", replace(LONG, budget=48, seed=7), POSITIONS),
    Preset("morphkv-loses", "Where MorphKV loses",
           "Another caption at 64 entries: MorphKV keeps 3 of the 12 claims, fewer than StreamingLLM (6), H2O "
           "and SnapKV (5). Over 12 captions MorphKV with its default window W = 8 trails H2O at every "
           "budget; with W = 16 it leads (docs/readme_kv.md).",
           "zoo:shapes-lm", replace(LONG, budget=64, seed=0), POSITIONS),
    *([Preset("real-recall", "A real model: StreamingLLM forgets where Mia lives",
              "SmolLM2-135M-Instruct reads a 102-token note through its chat template and is asked where Mia "
              "lives: with 64 of the 120 tokens kept, StreamingLLM answers wrong, while H2O, TOVA, SnapKV and "
              "MorphKV answer 'Tokyo' like the full cache.",
              f"zoo:{REAL_MODEL}", replace(RETRIEVAL, policy="streaming_llm", budget=64, context=96, seed=0),
              STEPS)] if real_model_in_zoo() else []),
)
