"""Talk: six findings in six minutes, one a minute, across the panels (zoo models and the real SmolLM2)."""
from analysis.talks import Step, Talk

TALK = Talk(
    "six-findings", "Six findings in six minutes",
    "Six things we measured inside small language models, one a minute, each with the number to look at.",
    steps=(
        Step("kv-cache", "needle-streaming", "A small memory forgets the fact",
             "When the model keeps only its first few and its newest words, the one fact it was asked about is "
             "gone and it answers wrong.", "kv.accuracy"),
        Step("caption-correction", "invented-objects", "A caption that makes things up",
             "A weak captioning model got every object in the picture wrong, and the checker drops every one of "
             "those claims.", "captions.factuality_before"),
        Step("attention-sharpness", "dispersion", "Attention blurs as the list grows",
             "The head that finds the largest number gives it barely half its attention once the list is long.",
             "sharpness.head_weight"),
        Step("prompt-reconstruction", "real-vocabulary", "Your prompt can be read back",
             "From the numbers halfway through a real model, the whole prompt comes back after a tiny share of "
             "the guesses a blind search would need.", "inversion.fewer"),
        Step("residual-stream", "real-capital", "One head recalls Paris",
             "In a real chat model one attention head brings back almost all of the answer Paris by itself.",
             "residual.best_head"),
        Step("residual-stream", "tuned-colour", "The answer shows up early",
             "A reader trained for each layer sees the right colour on top one layer before the model's output.",
             "residual.first_on_top"),
    ),
)
