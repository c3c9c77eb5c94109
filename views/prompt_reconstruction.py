"""Prompt reconstruction: recover a prompt from its hidden states; defences; Cascade sharding (components/views/inversion.py)."""
from components.views.inversion import InversionView

InversionView().render()
