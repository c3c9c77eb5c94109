"""Model access: loading a model safely and knowing its anatomy.

Loading under allowed roots with a parameter limit and the shared handle with its lock and
`patch()` (`models`, `model_lock`), where a model's layers, heads and norms are (`anatomy`), thread
and device placement (`threads`, `devices`), a processor's parts (`processor_info`), the zoo's real
model converted from its package (`real_models`) and tiny models of every family built from configs
(`tiny_models`).

Who may import it: the panels, the framework's cost gate and stores, components, scripts and tests.
It imports only the framework and the Shapes World data (`analysis.world`), never a panel or hosting.
"""
