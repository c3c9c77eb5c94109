"""Talk: a prompt read back from a model's inner states (the prompt-reconstruction page)."""
from analysis.talks import Step, Talk

TALK = Talk(
    "prompt-reconstruction", "Your prompt, read back from the model's insides",
    "Whoever sees the numbers a model computes halfway through can rebuild the prompt word by word, and these "
    "steps try the defences people suggest.",
    steps=(
        Step("prompt-reconstruction", "shuffle-fails", "Shuffling does not hide it",
             "Mixing up the order of the inner numbers still gives every word of the prompt back.",
             "inversion.recovered"),
        Step("prompt-reconstruction", "noise-defeats", "Heavy noise does",
             "Adding strong random noise hides almost every word, but it also ruins the numbers for the model "
             "itself.", "inversion.recovered"),
        Step("prompt-reconstruction", "real-vocabulary", "A real model, cheaply",
             "On a real model with forty-nine thousand words the attack gets the whole prompt back after trying "
             "a tiny share of the guesses a blind search would need.", "inversion.fewer"),
    ),
)
