"""Talk: why attention blurs as the list it reads grows (the attention-sharpness page)."""
from analysis.talks import Step, Talk

TALK = Talk(
    "attention-sharpness", "Attention blurs as the list grows",
    "A model that must pick the largest number from a list spreads its attention thinner the longer the list "
    "gets, and these steps measure how much.",
    steps=(
        Step("attention-sharpness", "dispersion", "One head, a longer list",
             "The head that finds the largest number looks almost only at it in a short list, but at barely half "
             "its attention in a list of a hundred and twenty-eight.", "sharpness.head_weight"),
        Step("attention-sharpness", "dispersion", "Fewer right answers",
             "As its attention spreads, the model's answers go from always right to right only about half the "
             "time.", "sharpness.accuracy"),
        Step("attention-sharpness", "adaptive-temperature", "The proposed fix",
             "Sharpening attention whenever it looks spread out, as the paper proposes, leaves the model just as "
             "wrong on long lists.", "sharpness.adaptive_accuracy"),
        Step("attention-sharpness", "real-retrieval-head", "A real model",
             "In a real chat model the best such head keeps only a sliver of its attention on the right item in "
             "a list of sixteen.", "sharpness.head_weight"),
    ),
)
