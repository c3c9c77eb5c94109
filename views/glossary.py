"""The glossary: every symbol the pages use, in one sentence, and where it is defined (components/glossary.py)."""
from components.glossary import draw

draw()
