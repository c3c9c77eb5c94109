"""Talk mode: a talk (analysis/talks/) one step per screen, opened by ?talk=NAME (components/talk.py)."""
from components.talk import present

present()
