"""The contribution graph (Ferrando & Voita 2024) against the ground truth of the zoo: on shapes-lm the needle's
value is where the answer comes from (the world's task puts it at a known token), so its route to the output must
be among the graph's strongest; on SmolLM2 exact patching finds that layer 23 moves the capital's country to the
last token (head H4 restores 0.93 alone), so that edge must be in the graph."""
from __future__ import annotations

import re

import pytest

from analysis.model_access.models import ModelSpec, load_model
from analysis.residual.contributions import contribution_graph, importances
from analysis.residual.errors import ResidualError
from analysis.residual.pairs import factual_pairs, needle_pair
from analysis.residual.prompts import encoded
from conftest import zoo_model_ready

REAL = "zoo:smollm2-135m-instruct"
TAU = 0.04


@pytest.fixture(scope="module")
def shapes():
    return load_model(ModelSpec.parse("zoo:shapes-lm"))


@pytest.fixture(scope="module")
def real():
    if not zoo_model_ready(REAL):
        pytest.skip(f"{REAL} is not converted here (python -m analysis.zoo build --only smollm2-135m-instruct)")
    return load_model(ModelSpec.parse(REAL))


def test_the_needles_route_is_among_the_strongest_paths(shapes):
    ranks = []
    for seed in range(10):
        pair = needle_pair(seed)
        at = int(re.search(r"token (\d+)", pair.where).group(1))
        g = contribution_graph(shapes, pair.clean, threshold=TAU)
        order = g.ranked_sources()
        assert at in order[:2], (seed, at, order[:3])  # measured: 1st in 7 of 10, 2nd in 3 (after the asked key)
        ranks.append(order.index(at))
        path = g.best_path[at]
        assert path[0].source == at and path[-1].target == g.position and path[-1].layer == g.layers - 1
        assert any(e.kind == "attn" and e.source == at for e in path)  # it crosses to the answer by attention
    assert ranks[:3] == [0, 0, 0]  # the pairs the page offers: the needle is the strongest path
    assert ranks.count(0) >= 7


def test_smollm2_moves_the_country_at_layer_23(real):
    pairs = [p for p in factual_pairs() if p.name.startswith("capital-")]
    assert len(pairs) == 17
    for pair in pairs:
        g = contribution_graph(real, pair.clean, threshold=TAU)
        subject = len(g.tokens) - 2  # the country, before ' is'
        edge = [e for e in g.edges if e.kind == "attn" and e.layer == 23 and e.source == subject
                and e.target == g.position]
        assert edge, pair.name  # measured: weight 0.24-0.48 over the 17 pairs
        assert edge[0].weight > 0.2
        assert max(range(g.heads), key=lambda h: edge[0].heads[h]) == 4  # H4 carries most of it
        assert g.ranked_sources()[0] == subject  # and the country's route is the strongest
        assert g.prediction.strip() == pair.answer.strip()


def test_the_position_can_be_any_token_and_the_cost_is_one_forward(shapes):
    pair = needle_pair(0)
    ids = encoded(shapes, pair.clean, "prompt")
    imp = importances(shapes, ids)
    g = contribution_graph(shapes, pair.clean, threshold=TAU, position=5)
    assert g.position == 5 and all(e.target <= 5 for e in g.edges)
    assert imp.attn.shape[:3] == (g.layers, ids.shape[1], ids.shape[1])
    with pytest.raises(ResidualError, match="outside the prompt"):
        contribution_graph(shapes, pair.clean, position=ids.shape[1])
    with pytest.raises(ResidualError, match="threshold"):
        contribution_graph(shapes, pair.clean, threshold=1.5)


def test_a_model_it_cannot_decompose_is_refused(tiny_gpt2):
    with pytest.raises(ResidualError, match="contribution graph"):
        contribution_graph(tiny_gpt2, "a b c")


def test_the_command_line_prints_the_graph_as_json(shapes, capsys):
    import json

    from analysis.residual.cli import cli
    from analysis.residual.contributions import ContributionGraph

    assert cli(["graph", "--model", "zoo:shapes-lm", "--pair", "needle-0", "--threshold", "0.08", "--json"]) == 0
    got = ContributionGraph.from_dict(json.loads(capsys.readouterr().out))
    assert got.threshold == 0.08 and got.ranked_sources()[0] == 15  # the needle's value, token 15
    assert got.best_path[15][0].source == 15
    assert cli(["graph", "--model", "zoo:shapes-lm", "--pair", "needle-0", "--position", "5"]) == 0
    assert "from position 5" in capsys.readouterr().out


@pytest.mark.parametrize("family, works", [("llama", True), ("mistral-sliding", True), ("qwen2", True),
                                           ("qwen3", True), ("gemma2", False), ("phi3", False), ("opt", False)])
def test_families_are_decomposed_or_refused_in_words(family, works):
    from analysis.model_access import tiny_models
    from analysis.model_access.models import ModelHandle, describe

    model, tok, _ = tiny_models.build_tiny(family)
    handle = ModelHandle(spec=ModelSpec("local", f"tiny-{family}"), model=model, kind="causal_lm",
                         info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)
    if works:  # the decomposition adds up to the captured outputs (else it refuses): importances sum to 1
        g = contribution_graph(handle, "a b c d e", threshold=0.0)
        imp = importances(handle, encoded(handle, "a b c d e", "prompt"))
        sums = imp.attn.sum((2, 3)) + imp.attn_residual
        assert float((sums - 1).abs().max()) < 1e-5 and g.edges
    else:
        with pytest.raises(ResidualError, match="contribution graph cannot"):
            contribution_graph(handle, "a b c d e")


def test_a_vlms_language_model(tiny_llava):
    g = contribution_graph(tiny_llava, "a b c d e", threshold=0.02)
    assert g.layers == 2 and g.edges and g.best_path[g.position]
