"""SAE-V feature browser: feature list, feature pages (permalink ?feature=K), explain an input, data ranking
and filtering, steering (components/views/sae.py)."""
from components.views.sae import SaeView

SaeView().render()
