"""The zoo's tools: train the demo models on Shapes World (`train`), measure them and write their model
cards (`cards`), and the command that does both (`python -m analysis.zoo build|eval`).

Its data: the committed demo weights under `models/<name>/`, the demo SAEs under `sae/`, and the real
models converted under the git-ignored `real_models/<name>/`. The world itself is analysis/world/ (below
the zoo: tasks and fixtures read it without the zoo); the real-model source is analysis/model_access/real_models.py,
beside the loader that asks it for a folder.
"""
