"""Plotly figures and HTML of each panel (one module per panel), and what they share: `memo` (figures
built once per result and shared across sessions), `text` (titles and legends that fit at 1024 px) and
`images` (a VLM's image as its vision tower sees it)."""
