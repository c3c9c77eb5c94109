"""Saved analyses: a gallery, a permalink (?id=...) that reopens one without recomputing, and its embed
(components/views/saved.py)."""
from components.views import saved

saved.render()
