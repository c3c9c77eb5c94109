"""The residual-stream panel's presets for a live talk: the zoo (where the answer sits is known) and the
real model (factual recall). tests/page/test_presets.py re-checks each sentence on the page."""
from __future__ import annotations

from analysis.framework.presets import REAL_MODEL, Preset, real_model_in_zoo
from analysis.residual.params import ResidualParams

REAL_CAPITAL = ("SmolLM2-135M-Instruct, 'The capital of France is' vs '... Italy is': patching the residual "
                "stream restores ' Paris' only at ' France' through layer 23 (1.00) and only at the last token "
                "from layer 24 on: layer 23 moves the fact, and its head H4 alone restores 0.93. Attribution "
                "patching agrees on the residual stream (r = 0.99).")

REAL_TUNED = ("SmolLM2-135M-Instruct, 'The capital of France is' (state s: the residual stream after s layers): the "
              "tuned lens ranks ' Paris' 5th at state 25 (the logit lens: 92nd), 3rd at state 27 (34th) and 2nd at "
              "state 29, and reads ' capital' on top from state 25 where the logit lens reads '.' or a space; both have "
              "' Paris' on top only at the output (state 30). Its translators were trained briefly (40 steps): in the "
              "middle states it ranks ' Paris' far lower than the logit lens does (at state 10: 11,664th vs 3,384th).")

PRESETS = (
    Preset("needle-found", "Patching finds the needle",
           "shapes-lm's needle prompt with the asked value 84 swapped for 92: patching the residual stream "
           "restores the answer only at token 15 (the needle's value, 1.00) in the embeddings, and only at the "
           "last token from layer 1 on; head L0H3 alone restores 0.73 of it.",
           "zoo:shapes-lm", ResidualParams(pair="needle-0", components=["residual", "heads"],
                                           other_model="zoo:shapes-vlm"), {"view": "patching"}),
    Preset("tuned-colour", "Tuned lens: a colour where the logit lens reads noise",
           "Decomposing a caption, shapes-lm must write the first object's colour, 'yellow'. After layer 2 the "
           "logit lens reads 'circle' and ranks 'yellow' 80th (7.6 nats from the final distribution); the tuned "
           "lens already reads a colour ('red'), with 'yellow' 2nd (1.3 nats). After layer 3 the tuned lens has "
           "'yellow' on top (P = 0.91) while the logit lens still shows 'blue'.",
           "zoo:shapes-lm", ResidualParams(pair="colour-1", lens="tuned", other_model="zoo:shapes-vlm"),
           {"view": "lens"}),
    *([Preset("real-capital", "A real model recalls a capital", REAL_CAPITAL, f"zoo:{REAL_MODEL}",
              ResidualParams(pair="capital-france", components=["residual", "heads"], other_model="zoo:shapes-lm"),
              {"view": "patching"}),
       Preset("real-tuned", "A real model's tuned lens: Paris in the top 5 from state 25", REAL_TUNED, f"zoo:{REAL_MODEL}",
              ResidualParams(pair="capital-france", lens="tuned", components=["residual", "heads"],
                             other_model="zoo:shapes-lm"), {"view": "lens"})] if real_model_in_zoo() else []),
)
