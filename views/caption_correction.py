"""Caption correction (CapMAS): split a caption into claims, verify each alone, rewrite without the false ones (components/views/captions.py)."""
from components.views.captions import CaptionView

CaptionView().render()
