"""The panel framework: what every panel is built from and every layer may import.

Settings and their validation (`settings`, `registry`), typed results (`results`), the errors a user
sees (`errors`), progress reports (`progress`), project paths (`paths`), the panel table (`panels`),
the cost gate (`cost`), stored results and presets (`precompute`, `presets`), and the rules of the
instance that analysis code itself enforces: its configuration (`config`), safe image decoding
(`images`) and the upload area's limits (`uploads`).

Who may import it: everyone (panels, model access, hosting, components, scripts). It imports no panel
and nothing from `analysis.hosting`; only the cost gate, precompute and presets read model access.
"""
