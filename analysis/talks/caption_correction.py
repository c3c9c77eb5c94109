"""Talk: a caption checked claim by claim against its picture (the caption-correction page)."""
from analysis.talks import Step, Talk

TALK = Talk(
    "caption-correction", "A caption that makes things up, corrected",
    "A weak captioning model describes a picture with mistakes, and another model checks every claim against "
    "the picture and rewrites the caption without the doubtful ones.",
    steps=(
        Step("caption-correction", "position-dropped", "A wrong position removed",
             "The caption put a shape where there is none, the checker doubted that claim, and after the rewrite "
             "every remaining claim is true.", "captions.factuality"),
        Step("caption-correction", "invented-objects", "Made-up objects",
             "This caption got every object wrong, so not one of its claims was true before the check.",
             "captions.factuality_before"),
        Step("caption-correction", "strict-threshold", "Only the sure claims",
             "Keeping only the claims the checker is certain of leaves a caption that is true but says almost "
             "nothing about the picture.", "captions.coverage"),
    ),
)
