"""The demo zoo: Shapes World (`shapes_world`), the training recipe (`train`), held-out metrics and
model cards (`cards`), and the committed weights under `models/<name>/`.

Rebuild with `python -m analysis.zoo build`, measure with `python -m analysis.zoo eval`.
"""
