"""Home: what is loaded, what each panel does, and a tour of the presets for live talks (components/views/home.py)."""
from components.views import home

home.render()
