"""Talk: where inside the model an answer is carried and when it appears (the residual-stream page)."""
from analysis.talks import Step, Talk

TALK = Talk(
    "residual-stream", "Where the answer lives inside the model",
    "Swapping one word between two prompts and copying pieces of one run into the other shows where the model "
    "carries the answer and at which layer it becomes readable.",
    steps=(
        Step("residual-stream", "needle-found", "One head carries the number",
             "Copying the work of a single attention head from the right prompt brings back most of the right "
             "answer on its own.", "residual.best_head"),
        Step("residual-stream", "tuned-colour", "Reading the answer early",
             "A reader trained for each layer sees the right colour on top one layer before the model's "
             "output.", "residual.first_on_top"),
        Step("residual-stream", "real-capital", "A real model recalls a capital",
             "In a real chat model one head of one late layer brings back almost all of the answer Paris by "
             "itself.", "residual.best_head"),
        Step("residual-stream", "real-tuned", "Paris close before the end",
             "Both readers put Paris on top only at the model's output, but the trained one ranks it fifth five "
             "layers earlier, where the plain reader ranks it 92nd.",
             "residual.first_on_top"),
    ),
)
