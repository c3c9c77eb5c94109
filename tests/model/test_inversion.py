"""Prompt reconstruction: exact recovery, equivalence with exhaustive search, defences, Cascade."""
from __future__ import annotations

import json

import pytest
import torch

from analysis import inversion as inv
from analysis.model_access.models import ModelSpec, load_model, zoo_models

PERMUTATIONS = [[], ["shuffle_positions"], ["shuffle_dims"], ["shuffle_both"]]


@pytest.fixture(scope="module")
def shapes_lm():
    if "shapes-lm" not in zoo_models():
        pytest.skip("the demo model shapes-lm is not built yet")
    return load_model(ModelSpec("zoo", "shapes-lm"))


def random_prompt(handle, n: int = 8, seed: int = 0) -> str:
    words = [w for w in handle.tokenizer.get_vocab() if not w.startswith("<")]
    words.sort()
    g = torch.Generator().manual_seed(seed)
    return " ".join(words[i] for i in torch.randint(0, len(words), (n,), generator=g).tolist())


def attack(handle, prompt, **kw) -> inv.AttackResult:
    """`reconstruct` with the attack's settings and its methods' settings (by field name) side by side."""
    names = {f.name for f, _ in inv.method_fields()}
    methods = inv.method_settings(**{k: kw.pop(k) for k in list(kw) if k in names})
    return inv.reconstruct(handle, inv.AttackParams(prompt=prompt, methods=methods, **kw))


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_gpt2", "shapes_lm"])
@pytest.mark.parametrize("defences", PERMUTATIONS, ids=lambda d: d[0] if d else "none")
def test_attack_recovers_random_prompts_exactly_at_every_layer(request, model, defences):
    handle = request.getfixturevalue(model)
    prompt = random_prompt(handle, seed=len(defences))
    # A RoPE model's layer 0 is the bare token embedding, which carries no position: with shuffled
    # rows only the bag of tokens is recoverable there (tested separately).
    first = 1 if (model != "tiny_gpt2" and defences and "dims" not in defences[0]) else 0
    for layer in range(first, handle.info.layers + 1):
        result = attack(handle, prompt, layer=layer, defences=defences, order="embedding")
        assert result.accuracy == 1.0, (layer, [(t.true_token, t.recovered_token) for t in result.tokens])
        assert all(t.certified for t in result.tokens)


def test_rope_embeddings_under_row_shuffle_leak_the_bag_of_tokens(tiny_llama):
    prompt = random_prompt(tiny_llama, seed=3)
    result = attack(tiny_llama, prompt, layer=0, defences=["shuffle_positions"], order="embedding")
    assert sorted(t.recovered_id for t in result.tokens) == sorted(t.true_id for t in result.tokens)


@pytest.mark.parametrize("order", list(inv.ORDERS))
def test_ordered_attack_returns_exactly_what_exhaustive_search_returns(tiny_llama, order):
    prompt = random_prompt(tiny_llama, n=6, seed=7)
    exhaustive = attack(tiny_llama, prompt, layer=2, exhaustive=True)
    ordered = attack(tiny_llama, prompt, layer=2, order=order, steps=4)
    assert [t.recovered_id for t in ordered.tokens] == [t.recovered_id for t in exhaustive.tokens]
    assert exhaustive.evaluations == 6 * exhaustive.vocab_size
    assert ordered.evaluations <= exhaustive.evaluations


def test_exhaustive_agrees_with_a_brute_force_reference_distance(tiny_gpt2):
    # Reference: full forward of prefix + candidate for every candidate, no cache, no batching.
    ids = tiny_gpt2.tokenizer(random_prompt(tiny_gpt2, n=3, seed=2))["input_ids"]
    layer = 1
    observed = inv.observed_states(tiny_gpt2, ids, layer)
    prefix = ids[:2]
    vocab = inv.vocab_size(tiny_gpt2)
    refs = torch.stack([inv.observed_states(tiny_gpt2, prefix + [c], layer)[-1] for c in range(vocab)])
    best = int((refs - observed[2]).abs().sum(1).argmin())
    result = inv.reconstruct(tiny_gpt2, inv.AttackParams(layer=layer, exhaustive=True), ids=ids)
    assert best == ids[2] == result.tokens[2].recovered_id
    assert result.tokens[2].distance == pytest.approx(float((refs[best] - observed[2]).abs().sum()), abs=1e-3)


def test_observed_states_equal_hugging_face_hidden_states(tiny_llama):
    ids = tiny_llama.tokenizer(random_prompt(tiny_llama, seed=5))["input_ids"]
    with tiny_llama.session():
        hs = tiny_llama.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    for layer in range(tiny_llama.info.layers):  # the last HF entry has the final norm applied
        torch.testing.assert_close(inv.observed_states(tiny_llama, ids, layer), hs[layer][0], atol=1e-5, rtol=1e-5)


def test_attack_works_on_a_vlm_language_model(tiny_llava):
    prompt = random_prompt(tiny_llava, seed=11)
    for defences in ([], ["shuffle_both"]):
        result = attack(tiny_llava, prompt, layer=tiny_llava.info.layers, defences=defences)
        assert result.accuracy == 1.0


def test_recovery_degrades_under_large_noise(tiny_llama):
    prompt = random_prompt(tiny_llama, n=10, seed=13)
    clean = attack(tiny_llama, prompt, layer=2, defences=["gaussian_noise"], sigma=0.0, order="embedding")
    noisy = attack(tiny_llama, prompt, layer=2, defences=["gaussian_noise"], sigma=3.0, order="embedding")
    assert clean.accuracy == 1.0
    assert noisy.accuracy <= 0.6, noisy.accuracy
    sweep = inv.sweep_noise(tiny_llama, inv.AttackParams(prompt=prompt, layer=2, order="embedding"),
                            [0.0, 3.0], permutations=["none", "shuffle_dims"])
    acc = {(p.defence, p.noise): p.accuracy for p in sweep.points}
    assert acc[("none", 0.0)] == acc[("shuffle_dims", 0.0)] == 1.0
    assert acc[("shuffle_dims", 3.0)] < 1.0


def test_quantisation_stays_within_its_tolerance_and_is_still_inverted(tiny_gpt2):
    states = torch.randn(5, 32)
    q = inv.Quantise(bits=3)
    moved = (q.apply(states, torch.Generator()) - states).abs().sum(1)
    assert float(moved.max()) <= q.tolerance(states) + 1e-6
    result = attack(tiny_gpt2, random_prompt(tiny_gpt2, seed=17), layer=1, defences=["quantise"], bits=8)
    assert result.accuracy == 1.0


def test_dimension_shuffle_keeps_sorted_rows_and_position_shuffle_keeps_the_row_set():
    states = torch.randn(6, 16)
    g = torch.Generator().manual_seed(0)
    dims = inv.ShuffleDims().apply(states, g)
    torch.testing.assert_close(dims.sort(1).values, states.sort(1).values)
    assert not torch.equal(dims, states)
    rows = inv.ShufflePositions().apply(states, g)
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, states.tolist()))


def test_calibrated_epsilon_lies_between_numerical_noise_and_the_nearest_wrong_token(tiny_llama):
    prompt = random_prompt(tiny_llama, n=5, seed=19)
    result = attack(tiny_llama, prompt, layer=2, exhaustive=True)
    assert max(t.distance for t in result.tokens) <= result.epsilon
    ids = [t.true_id for t in result.tokens]
    observed = inv.observed_states(tiny_llama, ids, 2)
    wrong = [(c, ids[:-1] + [c]) for c in range(inv.vocab_size(tiny_llama)) if c != ids[-1]][:40]
    nearest = min(float((inv.observed_states(tiny_llama, seq, 2)[-1] - observed[-1]).abs().sum()) for _, seq in wrong)
    assert nearest > 100 * result.epsilon


def test_bad_inputs_raise_clear_messages(tiny_llama):
    with pytest.raises(inv.InversionError, match="empty"):
        attack(tiny_llama, "   ")
    with pytest.raises(inv.InversionError, match="out of range"):
        attack(tiny_llama, "w1 w2", layer=tiny_llama.info.layers + 1)
    with pytest.raises(inv.InversionError, match="limit"):
        attack(tiny_llama, " ".join(["w1"] * 70))
    with pytest.raises(inv.InversionError, match="Unknown defence"):
        attack(tiny_llama, "w1 w2", defences=["rot13"])


def test_result_round_trips_through_json(tiny_gpt2):
    result = attack(tiny_gpt2, "w1 w2 w3", layer=1, order="model")
    again = inv.AttackResult.from_json(result.to_json())
    assert again.tokens[1].recovered_id == result.tokens[1].recovered_id
    assert again.params.order == "model"


def test_cli_prints_json(tiny_gpt2_dir, tiny_gpt2, capsys):
    code = inv.cli(["--model", f"local:{tiny_gpt2_dir}", "--prompt", "w5 w6 w7", "--layer", "2",
                    "--defence", "shuffle_both", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["accuracy"] == 1.0 and out["params"]["defences"] == ["shuffle_both"]


# --- Cascade ------------------------------------------------------------------------------------


def test_shardings_assign_positions_and_gaps():
    assert inv.RoundRobin().assign(7, 3) == [0, 1, 2, 0, 1, 2, 0]
    assert inv.Blocks().assign(7, 3) == [0, 0, 0, 1, 1, 1, 2]
    view = inv.party_view(1, inv.RoundRobin().assign(7, 3), vocab=10)
    assert view.positions == [1, 4] and view.gaps == [1, 2] and view.largest_gap == 2
    assert view.log10_cost == pytest.approx(torch.log10(torch.tensor(10.0 ** 2 + 10.0 ** 3)).item(), abs=1e-6)
    first_block = inv.party_view(0, inv.Blocks().assign(7, 3), vocab=10)
    assert first_block.gaps == [0, 0, 0]


def test_cascade_verdict_depends_on_vocabulary_gap_and_sharding():
    def verdict(vocab, parties, sharding="round_robin", n=12):
        assignment = inv.SHARDINGS.create(sharding).assign(n, parties)
        return inv.cascade_verdict([inv.party_view(p, assignment, vocab) for p in range(parties)], vocab)

    assert verdict(120, 2).startswith("Breakable") and "vocabulary" in verdict(120, 2)
    assert verdict(50_257, 2).startswith("Expensive")
    assert verdict(50_257, 4).startswith("Out of brute-force reach")
    assert verdict(50_257, 4, "blocks").startswith("Breakable") and "start of the prompt" in verdict(50_257, 4, "blocks")


def test_cascade_brute_force_recovers_a_round_robin_view_on_a_small_vocabulary(tiny_llama):
    prompt = random_prompt(tiny_llama, n=5, seed=23)
    result = inv.simulate_cascade(tiny_llama, inv.CascadeParams(prompt=prompt, layer=2, parties=2, attacker=0))
    assert result.brute_force_ran and result.attacker_accuracy == 1.0
    ids = result.token_ids
    assert result.recovered == ids[:5]  # the gaps are recovered too
    assert result.evaluations <= inv.vocab_size(tiny_llama) * (1 + 2 * inv.vocab_size(tiny_llama))
    assert "Breakable" in result.verdict


def test_cascade_does_not_brute_force_over_budget(tiny_llama):
    prompt = random_prompt(tiny_llama, n=8, seed=29)
    result = inv.simulate_cascade(tiny_llama, inv.CascadeParams(prompt=prompt, layer=1, parties=4, attacker=3,
                                                                budget=1000))
    assert not result.brute_force_ran and result.evaluations == 0
    assert result.parties[3].largest_gap == 3


# --- the estimate's forecast of the search ------------------------------------------------------------


def test_forecast_counts_the_model_orders_search_exactly(tiny_llama):
    """The model order's search ends at the true token's rank in the model's own distribution (its start
    prior at position 0): the forecast read from one forward of the prompt is the attack's count."""
    from analysis.inversion import cost as C

    prompt = random_prompt(tiny_llama, n=8, seed=31)
    params = inv.AttackParams(prompt=prompt, layer=2, order="model", first_batch=4, max_batch=64)
    ids = inv.tokenize(tiny_llama, prompt)
    ranks = C.model_ranks(tiny_llama, params, ids)
    result = inv.reconstruct(tiny_llama, params)
    assert [t.rank for t in result.tokens] == ranks
    assert [s.candidates for s in C.forecast(tiny_llama, params, ids, ranks)] == [t.evaluations for t in result.tokens]
    hybrid = inv.AttackParams(prompt=prompt, layer=2, first_batch=4, max_batch=64)
    attack = inv.reconstruct(tiny_llama, hybrid)  # interleaved with the embedding order: at most the forecast
    assert all(t.evaluations <= s.candidates for t, s in zip(attack.tokens, C.forecast(tiny_llama, hybrid, ids, ranks)))


def test_scan_follows_the_batcher():
    from analysis.inversion import cost as C

    assert C.scan(1, [100], 16, 1024) == C.Search(16, 1)
    assert C.scan(17, [100], 16, 1024) == C.Search(80, 2)  # 16, then 64
    assert C.scan(81, [100], 16, 1024) == C.Search(100, 3)  # the chunk's last 20
    assert C.scan(40, [32, 100], 16, 1024) == C.Search(48, 3)  # a new chunk starts again at 16
    tried: list[int] = []
    sizes = [len(b) for b in inv.candidate_batches(iter([torch.arange(100)]), 100, 16, 1024, tried)]
    assert sizes == [16, 64, 20]
