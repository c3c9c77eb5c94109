"""One module per panel's page: a `View` (components/view.py) declaring its sections, its run and what it shows."""
