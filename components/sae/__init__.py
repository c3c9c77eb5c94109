"""What the SAE-V page draws from its results: the feature list and pages, an explained input, a ranking
with its exports, and steering side by side. The page (views/sae_features.py) reads the controls and runs
the analyses through the shared runner; these functions only render what it hands them."""

