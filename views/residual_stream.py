"""Residual stream: what each layer already predicts, which activations carry the answer, what writes it (components/views/residual.py)."""
from components.views.residual import ResidualView

ResidualView().render()
