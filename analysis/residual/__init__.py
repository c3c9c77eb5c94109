"""Residual stream: logit and tuned lens, activation and attribution patching, direct logit attribution,
two prompts or two models side by side.

Read in this order:
- `sites.py`: where each layer adds to the residual stream (attention, MLP, each head's slice of the output
  projection) and how a norm acts on a sum of parts; `hooks.py`: every capture and patch, in one place;
- `lenses.py`: the lenses (logit, tuned), each a class in `LENSES`; `translators.py`: the tuned lens's stored
  translators, found by the model's weights hash; `lens_training.py`: the tuned-lens recipe that trains them for
  any model (the page, `train-lens`, and the zoo's analysis/zoo/train/tuned_lens.py);
- `generation.py`: generate and inspect, the commitment strip of every generated token; `branching.py`: another
  of the model's top tokens at one generated token, and the text regenerated from there;
- `dla.py`: direct logit attribution; `patching.py`: the patched components (`COMPONENTS`) and the methods
  (`METHODS`: exact, attribution); `atp.py`: AtP* (QK fix, GradDrop), a head's queries and keys as
  components, and the false negatives of an estimate;
- `pairs.py`: prompt pairs with known answers; `prompts.py`: tokens and scored tokens;
- `params.py`, `records.py`, `analysis.py`: settings, typed results, the run functions;
- `cost.py`: their work counts; `cli.py`: `python -m analysis residual`; `presets.py`: live-talk settings
  (the page: components/views/residual.py).
"""
from __future__ import annotations

from analysis.framework.panels import Analysis, Run
from analysis.residual.analysis import atp_sweep, inspect, pair_sweep, patch, side_by_side, weights_elsewhere
from analysis.residual.cli import cli
from analysis.residual.branching import branch, check_branch
from analysis.residual.cost import (
    atp_sweep_work, branch_work, generate_work, inspect_work, patch_work, side_work, sweep_work,
    train_lens_work,
)
from analysis.residual.generation import generate
from analysis.residual.errors import ResidualError
from analysis.residual.lens_training import LensRecipe, train_lens
from analysis.residual.lenses import LENSES, readout
from analysis.residual.pairs import OWN, Pair, pairs_for
from analysis.residual.params import ResidualParams, ResidualState, validate_params
from analysis.residual.presets import PRESETS
from analysis.residual.patching import COMPONENTS, METHODS
from analysis.residual.records import (
    Branch, Dla, Generation, Inspection, LensGrid, LensTraining, PairSweep, PatchGrid, Patching, SideBySide,
    Strip,
)

ANALYSIS = Analysis(
    name="residual", title="Residual stream", icon=":material/stacked_line_chart:", page="residual_stream.py",
    summary="What each layer already predicts (logit and tuned lens), which activations carry the answer "
            "(activation and attribution patching), what writes it (direct logit attribution), side by side.",
    paper="Tuned lens (Belrose et al. 2023); activation patching (Meng et al. 2022)", kinds=("causal_lm", "vlm"),
    runs=(Run(inspect, inspect_work), Run(patch, patch_work), Run(side_by_side, side_work),
          Run(pair_sweep, sweep_work), Run(generate, generate_work), Run(branch, branch_work),
          Run(atp_sweep, atp_sweep_work), Run(train_lens, train_lens_work, trains=True)),
    cli=cli, params=ResidualParams, view_state=ResidualState, presets=PRESETS,
)

__all__ = [
    "ANALYSIS", "atp_sweep", "inspect", "pair_sweep", "patch", "side_by_side", "weights_elsewhere", "cli", "inspect_work", "patch_work", "side_work",
    "sweep_work", "ResidualError", "LENSES", "readout", "OWN", "Pair", "pairs_for", "ResidualParams",
    "ResidualState", "validate_params", "COMPONENTS", "METHODS", "Dla", "Inspection", "LensGrid", "PairSweep", "PatchGrid",
    "Patching", "SideBySide", "generate", "generate_work", "Generation", "Strip", "branch", "check_branch",
    "branch_work", "Branch",
    "LensRecipe", "train_lens", "train_lens_work", "LensTraining",
]
