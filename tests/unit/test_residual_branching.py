"""Branching generations against references written here: a branch's continuation is what a plain greedy loop
(no cache, float64) or a plain seeded `model.generate` gives on prompt + prefix + the chosen token, and every
probability is a float64 softmax of a plain forward's logits at that position."""
from __future__ import annotations

import math

import pytest
import torch

from analysis.framework.errors import SettingsError
from analysis.model_access.models import ModelSpec, load_model, zoo_models
from analysis.residual import ResidualParams, branch, generate
from analysis.residual.prompts import prompt_ids

PROMPT = "w3 w17 w5 w40 w8"


def _params(**kw) -> ResidualParams:
    return ResidualParams(pair="own", prompt=PROMPT, corrupt=PROMPT, **kw)


def _greedy_loop(model, ids: list[int], n: int, eos: set[int]) -> list[int]:
    """Plain greedy decoding: the whole sequence through the model each step, argmax in float64."""
    seq, out = list(ids), []
    for _ in range(n):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1].double()
        nxt = int(logits.argmax())
        out.append(nxt)
        seq.append(nxt)
        if nxt in eos:
            break
    return out


def _probs(model, ids: list[int], start: int) -> list[float]:
    """P(ids[i] | ids[:i]) for i >= start: a float64 softmax over each position's logits, one token at a time."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    out = []
    for i in range(start, len(ids)):
        row = logits[i - 1]
        out.append(math.exp(float(row[ids[i]]) - math.log(sum(math.exp(float(v - row.max())) for v in row)) - float(row.max())))
    return out


def _other_than(alts: list[int], token: int) -> int:
    return next(a for a in alts if a != token)


def test_a_greedy_branch_is_a_plain_greedy_loop_from_the_chosen_token(tiny_llama):
    h = tiny_llama
    params = _params(new_tokens=10)
    gen = generate(h, params)
    at = 3
    chosen = _other_than(gen.alternative_ids[at], gen.token_ids[at])
    b = branch(h, params, at=at, token=chosen, main=tuple(gen.token_ids))
    prompt = prompt_ids(h.tokenizer, PROMPT)
    eos = {h.tokenizer.eos_token_id}
    assert b.ids == [chosen] + _greedy_loop(h.model, prompt + gen.token_ids[:at] + [chosen], 10 - at - 1, eos)
    assert b.main_ids == gen.token_ids[at:] and b.first_difference == 0 and len(b.ids) == len(b.main_ids)
    expected = _probs(h.model, prompt + gen.token_ids[:at] + b.ids, len(prompt) + at)
    assert b.prob == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert b.main_prob == pytest.approx(_probs(h.model, prompt + gen.token_ids, len(prompt) + at), rel=1e-5, abs=1e-7)
    assert b.main_prob == pytest.approx(gen.prob[at:], rel=1e-4, abs=1e-6)  # the generation's own P agree
    assert b.path_prob == pytest.approx(math.prod(expected), rel=1e-5)
    assert b.main_path_prob == pytest.approx(math.prod(b.main_prob), rel=1e-5)
    # choosing the token the main text has gives the main text back
    same = branch(h, params, at=at, token=gen.token_ids[at], main=tuple(gen.token_ids))
    assert same.ids == gen.token_ids[at:] and same.first_difference is None


def test_alternatives_are_the_models_top_k_with_float64_probabilities(tiny_llama):
    h = tiny_llama
    gen = generate(h, _params(new_tokens=6, top_k=4))
    prompt = prompt_ids(h.tokenizer, PROMPT)
    with torch.no_grad():
        logits = h.model(input_ids=torch.tensor([prompt + gen.token_ids])).logits[0].double()
    for k in range(len(gen.token_ids)):
        row = torch.softmax(logits[len(prompt) + k - 1], -1)
        top = sorted(range(len(row)), key=lambda i: -float(row[i]))[:4]
        assert gen.alternative_ids[k] == top
        assert gen.alternative_probs[k] == pytest.approx([float(row[i]) for i in top], rel=1e-4, abs=1e-7)
        assert gen.alternative_tokens[k] == [h.tokenizer.decode([i]) for i in top]


def test_a_sampled_branch_is_a_plain_seeded_generate_from_the_chosen_token(tiny_llama):
    from transformers import GenerationConfig

    h = tiny_llama
    params = _params(new_tokens=12, decoding="sample", seed=11, temperature=1.5)
    gen = generate(h, params)
    at = 2
    chosen = _other_than(gen.alternative_ids[at], gen.token_ids[at])
    b = branch(h, params, at=at, token=chosen, main=tuple(gen.token_ids))
    start = prompt_ids(h.tokenizer, PROMPT) + gen.token_ids[:at] + [chosen]
    torch.manual_seed(11)
    tok = h.tokenizer
    out = h.model.generate(input_ids=torch.tensor([start]), attention_mask=torch.ones(1, len(start), dtype=torch.long),
                           generation_config=GenerationConfig(max_new_tokens=12 - at - 1, do_sample=True,
                                                              temperature=1.5, top_k=0, top_p=1.0,
                                                              eos_token_id=tok.eos_token_id,
                                                              pad_token_id=tok.pad_token_id))
    assert b.ids == [chosen] + out[0, len(start):].tolist()
    assert branch(h, params, at=at, token=chosen, main=tuple(gen.token_ids)).ids == b.ids  # the seed decides


def test_a_branch_outside_the_text_or_the_vocabulary_is_one_line(tiny_llama):
    h = tiny_llama
    params = _params(new_tokens=4)
    gen = generate(h, params)
    with pytest.raises(SettingsError, match=r"0\.\.3"):
        branch(h, params, at=4, token=1, main=tuple(gen.token_ids))
    with pytest.raises(SettingsError, match="token id"):
        branch(h, params, at=0, token=10**6, main=tuple(gen.token_ids))


@pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo")
def test_on_shapes_lm_a_branch_at_the_colour_is_what_a_greedy_loop_gives():
    """colour-0's text is 'blue circle ; ...' (the scene's small blue circle); its runner-up there is 'green'."""
    h = load_model(ModelSpec("zoo", "shapes-lm"))
    params = ResidualParams(pair="colour-0", new_tokens=8)
    gen = generate(h, params)
    assert gen.tokens[0] == "blue" and gen.alternative_tokens[0][1] == "green"
    green = gen.alternative_ids[0][1]
    b = branch(h, params, at=0, token=green, main=tuple(gen.token_ids))
    prompt = prompt_ids(h.tokenizer, gen.prompt)
    assert b.ids == [green] + _greedy_loop(h.model, prompt + [green], 7, {h.tokenizer.eos_token_id})
    assert b.prob == pytest.approx(_probs(h.model, prompt + b.ids, len(prompt)), rel=1e-5, abs=1e-9)
    assert b.first_difference == 0 and b.path_prob < 1e-4 < 0.99 < b.main_path_prob


@pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo")
def test_the_command_line_prints_the_branch_in_its_json(capsys):
    import json

    from analysis.residual.cli import cli

    args = ["generate", "--model", "zoo:shapes-lm", "--pair", "colour-0", "--new-tokens", "6"]
    assert cli(args + ["--json"]) == 0
    main = json.loads(capsys.readouterr().out)
    green = main["alternative_ids"][0][1]
    assert cli(args + ["--branch-at", "0", "--branch-token", str(green), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == main["token_ids"] and out["branch"]["ids"][0] == green
    assert out["branch"]["main_ids"] == main["token_ids"] and out["branch"]["first_difference"] == 0
    with pytest.raises(SettingsError, match="go together"):
        cli(args + ["--branch-at", "0"])


def test_texts_of_different_lengths_compare_over_their_common_length():
    from analysis.residual import Branch

    b = Branch(at=2, token_id=5, token="x", main_ids=[1, 2, 3, 4], main_tokens=list("abcd"), main_prob=[0.5, 0.5, 0.5, 0.5],
               main_text="abcd", ids=[5, 6], tokens=list("xy"), prob=[0.1, 0.9], text="xy", ended=True,
               first_difference=0, main_path_prob=0.0625, path_prob=0.09)
    n, main, branched = b.over_common_length()
    assert (n, main, branched) == (2, pytest.approx(0.25), pytest.approx(0.09))


def test_a_vlms_language_model_branches_like_a_greedy_loop(tiny_llava_dir):
    h = load_model(ModelSpec("local", str(tiny_llava_dir)))
    params = _params(new_tokens=6)
    gen = generate(h, params)
    chosen = _other_than(gen.alternative_ids[1], gen.token_ids[1])
    b = branch(h, params, at=1, token=chosen, main=tuple(gen.token_ids))
    start = prompt_ids(h.tokenizer, PROMPT) + gen.token_ids[:1] + [chosen]
    assert b.ids == [chosen] + _greedy_loop(h.language_model, start, 4, {h.tokenizer.eos_token_id})
    assert b.prob == pytest.approx(_probs(h.language_model, start[:-1] + b.ids, len(start) - 1), rel=1e-5, abs=1e-7)
