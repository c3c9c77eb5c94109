"""Talk: features a vision-language model shares between words and pictures (the SAE-V page, demo zoo)."""
from analysis.talks import Step, Talk

TALK = Talk(
    "sae-features", "Features that see words and pictures",
    "A sparse autoencoder splits what a small vision-language model computes into features, and a few of them "
    "fire on a caption's words and on the picture's patches of the same thing.",
    steps=(
        Step("sae-features", "cross-modal-list", "A few features see both",
             "Out of a thousand features only a few dozen fire on both the caption's words and the picture's "
             "patches, and of the others that fire at all most read only words.", "sae.cross_modal"),
        Step("sae-features", "cross-modal-feature", "One feature, a word and a patch",
             "This feature fires on caption words and on picture patches among its strongest places, so it "
             "stands for one idea whichever way the model sees it.", "sae.image_top"),
        Step("sae-features", "ranking-other-scene", "Does this caption belong to this picture?",
             "Scoring every picture and caption by the features they share puts a caption of another scene far "
             "down the list of three hundred pairs, well below the true captions.", "sae.other_scene_rank"),
        Step("sae-features", "steer-middle-right", "Push one feature and the object moves",
             "Adding the feature for the middle right to the picture makes the model write that the triangle "
             "sits at the middle right instead of the bottom left.", "sae.steer_changed"),
    ),
)
