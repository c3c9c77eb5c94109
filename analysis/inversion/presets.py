"""The prompt-reconstruction panel's presets: settings that show one finding of *Hidden No More* and
*Cascade* on the demo zoo (analysis/framework/presets.py; tests/page/test_presets.py re-checks each sentence)."""
from __future__ import annotations

from dataclasses import replace

from analysis.inversion.params import AttackParams
from analysis.framework.presets import REAL_MODEL, Preset, real_model_in_zoo
from analysis.tasks.generic import PLAIN_PROMPT  # the page's prompt on a model outside Shapes World

ATTACK = AttackParams(prompt="there is a large red circle at the top left . there is a small blue square at the "
                             "bottom right .", layer=2)
VIEW = {"perm": "none", "perturb": "none", "sweeps": False, "exhaustive": False, "parties": 2,
        "sharding": "round_robin", "attacker": 0, "budget": 1_000_000}

PRESETS = (
    Preset("shuffle-fails", "Shuffling does not protect",
           "States of layer 2 with their positions shuffled still give the prompt back token for token: the "
           "attacker matches against every unused row (only at layer 0 of a rotary model, the bare token "
           "embeddings, does the order stay hidden).",
           "zoo:shapes-lm", ATTACK, {**VIEW, "perm": "shuffle_positions"}),
    Preset("noise-defeats", "Noise defeats the attack",
           "Gaussian noise of two state standard deviations buries the difference between neighbouring "
           "tokens: almost every position comes back wrong (and the states are useless for the model too).",
           "zoo:shapes-lm", AttackParams.from_flat({**ATTACK.flat(), "sigma": 2.0}),
           {**VIEW, "perturb": "gaussian_noise"}),
    *([Preset("real-vocabulary", "A real 49 k vocabulary",
              "SmolLM2-135M-Instruct, a real trained model: from its layer-15 states (of 30) all 14 tokens of the "
              "prompt come back exactly, each certified, after scoring 1,728 candidates instead of exhaustive "
              "search's 688,128 (14 positions × 49,152 tokens): 398× fewer.",
              f"zoo:{REAL_MODEL}", replace(ATTACK, prompt=PLAIN_PROMPT, layer=15), {**VIEW, "exhaustive": True})]
      if real_model_in_zoo() else []),
    Preset("cascade-contiguous", "Cascade: contiguous shards leak",
           "Contiguous blocks hand party 0 the start of the prompt with no gap: it inverts its shard with "
           "about 2,000 candidate sequences. Round-robin leaves gaps of k − 1 and costs ~47,000 — with a "
           "182-word vocabulary both are within reach (the verdict says so).",
           "zoo:shapes-lm", ATTACK, {**VIEW, "sharding": "blocks"}),
)
