"""The residual-stream panel on the demo zoo and the real zoo model: the stored tuned lenses beat the logit
lens on fresh held-out text, activation patching finds where each Shapes World answer sits, and on
SmolLM2 the logit lens ends at the model's own logits and factual recall shows the known pattern."""
from __future__ import annotations

import pytest
import torch

from analysis.model_access.models import ModelSpec, load_model
from analysis.residual import ResidualParams, analysis, pairs_for
from analysis.residual.hooks import trace
from analysis.residual.lenses import readout
from analysis.residual.translators import for_model
from conftest import zoo_model_ready

REAL = "zoo:smollm2-135m-instruct"


@pytest.fixture(scope="module")
def shapes_lm():
    return load_model(ModelSpec.parse("zoo:shapes-lm"))


@pytest.fixture(scope="module")
def smollm2():
    if not zoo_model_ready(REAL):
        pytest.skip(f"{REAL} is not converted here (python -m analysis.zoo build --only smollm2-135m-instruct)")
    return load_model(ModelSpec.parse(REAL))


def mean_kl(handle, sequences, translators=None) -> list[float]:
    """KL(final || lens) per state, mean over every token, computed here from the residual states."""
    lm = handle.language_model
    totals, count = None, 0
    for ids in sequences:
        tr = trace(handle, torch.tensor([ids]), want=("resid",), keep=1)
        states = [tr.acts["resid"][i][0] for i in sorted(tr.acts["resid"])]
        with torch.no_grad():
            final = torch.log_softmax(readout(lm, states[-1]).float(), -1)
            kl = []
            for i, h in enumerate(states):
                x = h if translators is None else translators.apply(i, h)
                logp = torch.log_softmax(readout(lm, x).float(), -1)
                kl.append(float((final.exp() * (final - logp)).sum()))
        totals = kl if totals is None else [a + b for a, b in zip(totals, kl)]
        count += len(ids)
    return [t / count for t in totals]


def test_tuned_lens_beats_the_logit_lens_at_every_layer_of_shapes_lm(shapes_lm):
    from analysis.world import shapes_world as sw

    seeds = sw.split_seeds("test", sw.SPLIT_SIZE)[5000:5030]  # scenes the lens never saw
    texts = [" ".join(sw.decompose_example(sw.generate_scene(s))) for s in seeds]
    seqs = [shapes_lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    logit, tuned = mean_kl(shapes_lm, seqs), mean_kl(shapes_lm, seqs, for_model(shapes_lm))
    for layer in range(len(logit) - 1):
        assert tuned[layer] < logit[layer], (layer, logit, tuned)
    assert tuned[-1] == logit[-1] == pytest.approx(0.0, abs=1e-6)


def test_patching_finds_each_shapes_world_answer_where_the_world_put_it(shapes_lm):
    for pair in pairs_for(shapes_lm):
        r = analysis.patch(shapes_lm, ResidualParams(pair=pair.name, components=["residual"], methods=["exact"]))
        known = int(pair.where.rsplit("token ", 1)[1].rstrip(")"))
        grid = r.grid("residual", "exact").share
        assert r.changed == [known]
        assert grid[0][known] == pytest.approx(1.0, abs=1e-4)  # the embeddings of that token carry it all
        assert all(abs(v) < 1e-4 for j, v in enumerate(grid[0]) if j != known)
        assert r.clean_diff > 0 > r.corrupt_diff  # the model answers both prompts as the world says


def test_real_model_logit_lens_ends_at_its_logits_and_recall_moves_to_the_last_token(smollm2):
    params = ResidualParams(pair="capital-france", components=["residual"])
    seen = analysis.inspect(smollm2, params)
    assert seen.lens.last_gap == 0.0 and seen.prediction.strip() == "Paris"
    r = analysis.patch(smollm2, params)
    grid = r.grid("residual", "exact").share
    subject = r.changed[-1]
    assert all(grid[i][subject] > 0.9 for i in range(0, 20))  # the subject's token holds the fact ...
    assert all(grid[i][-1] > 0.9 for i in range(26, 30))  # ... until the last token has read it
    assert r.correlation["residual"] > 0.9


def test_real_model_tuned_lens_is_closer_to_the_final_distribution_in_the_middle(smollm2):
    seqs = [smollm2.tokenizer(t)["input_ids"] for t in (
        "The committee will meet again next week to discuss the budget for the new library.",
        "Rivers carry water from the mountains to the sea, shaping valleys along the way.")]
    logit, tuned = mean_kl(smollm2, seqs), mean_kl(smollm2, seqs, for_model(smollm2))
    middle = range(5, 25)
    assert sum(tuned[i] for i in middle) < sum(logit[i] for i in middle)
