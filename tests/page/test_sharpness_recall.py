"""Key-value recall, the sharpness panel's task for a real LM: the prompt marks the asked code, answers are
scored over the prompt's codes (multi-token codes through a candidate tree in the same forward, checked
against separate forwards), the rules' own settings reach the analysis, and old saved analyses open."""
from __future__ import annotations

import json
import math

import pytest
import torch

from analysis import sharpness as S
from analysis.model_access.models import ModelSpec, load_model
from analysis.tasks.retrieval import RECALL_KEYS, recall_builder

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def recall_tokenizer(split_digits: bool = True, chat: bool = False):
    """A word-level tokenizer that spells the recall prompt; with `split_digits` it writes "41" as "4", "1"
    (as SmolLM2, Llama and Qwen do), else each two-digit code is one token (as GPT-2 does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<s>", "</s>"] + (["<|im_start|>", "<|im_end|>"] if chat else [])
    words = specials + ["The", "code", "of", "is", ".", "user", "assistant", *RECALL_KEYS]
    words += [str(d) for d in range(10)] if split_digits else [str(d) for d in range(10, 100)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    pre = [pre_tokenizers.Whitespace()] + ([pre_tokenizers.Digits(individual_digits=True)] if split_digits else [])
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", additional_special_tokens=specials[4:] or None)
    if chat:
        fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="module")
def recall_llama_dir(model_root):
    """A tiny random Llama whose tokenizer splits digits and has a chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from analysis.model_access import tiny_models

    folder = model_root / "tiny-llama-recall"
    tok = recall_tokenizer(split_digits=True, chat=True)
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False))
    tiny_models._spread_weights(model)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def recall_llama(recall_llama_dir):
    return load_model(ModelSpec("local", str(recall_llama_dir)))


# --- the prompt ------------------------------------------------------------------------------------


@pytest.mark.parametrize("split_digits", [True, False])
def test_recall_prompt_marks_the_asked_code_and_scores_every_code(split_digits):
    tok = recall_tokenizer(split_digits)
    build = recall_builder(tok)
    lengths = set()
    for seed in range(5):
        pr = build(8, seed)
        lengths.add(len(pr.input_ids))
        assert pr.task == S.RECALL and pr.chance == 1 / 8 and len(pr.keys) == len(set(pr.keys)) == 8
        asked = pr.text.rsplit("The code of ", 1)[1].split()[0]
        assert pr.answer == str(pr.values[pr.keys.index(asked)])
        # the target tokens are exactly the asked item's code, wherever the item stands
        assert "".join(tok.decode([pr.input_ids[t]]) for t in pr.target).replace(" ", "") == pr.answer
        codes = sorted(set(pr.values))
        assert [tok.decode(c).replace(" ", "") for c in pr.candidates] == [str(c) for c in codes]
        assert pr.answer_index == codes.index(int(pr.answer)) and pr.answer_id == pr.candidates[pr.answer_index][0]
        assert all(len(c) == (2 if split_digits else 1) for c in pr.candidates)
        assert tok.decode(pr.input_ids).endswith(f"The code of {asked} is")
    assert len(lengths) == 1  # one-token keys: every prompt of one n has one length (one batch)


def test_recall_prompt_goes_through_the_chat_template():
    tok = recall_tokenizer(chat=True)
    pr = recall_builder(tok)(4, 0)
    assert pr.chat and pr.text.startswith("<|im_start|> user The code of")
    assert "<|im_start|> assistant The code of" in pr.text and pr.text.endswith("is")
    assert tok.convert_tokens_to_ids("<|im_start|>") == pr.input_ids[0]


def test_more_items_than_keys_are_skipped_not_failed(recall_llama):
    res = S.size_sweep(recall_llama, S.SweepParams(ns=[4, 1000], thetas=[], samples=1))
    assert [p.n for p in res.points] == [4] and res.skipped == [1000]
    assert res.task == S.RECALL and res.points[0].chance == 0.25
    assert "chance" in res.accuracy_table()[0] and "softmax runner-up" not in res.accuracy_table()[0]


def test_toy_tokenizers_keep_max_retrieval(tiny_llama):
    assert S.build_prompt(tiny_llama.tokenizer, 6).task == S.MAX_RETRIEVAL


# --- scoring over the candidates -------------------------------------------------------------------


def _reference_logprobs(handle, prompt, theta: float | None = None) -> list[float]:
    """log P(candidate) by one plain forward per candidate (prompt + candidate tokens), float64 sums;
    with `theta`, eager attention with its scaling divided by θ (softmax(s / θ), an independent path)."""
    out = []
    for cand in prompt.candidates:
        ids = torch.tensor([prompt.input_ids + cand])
        with handle.patch() as p, torch.no_grad():
            if theta is not None:
                for m in handle.model.modules():
                    if hasattr(m, "scaling") and hasattr(m, "layer_idx"):
                        p.setattr(m, "scaling", m.scaling / theta)
            logp = torch.log_softmax(handle.language_model(input_ids=ids).logits[0].double(), -1)
        start = len(prompt.input_ids) - 1
        out.append(sum(float(logp[start + j, tok]) for j, tok in enumerate(cand)))
    return out


@pytest.mark.parametrize("theta", [None, 0.5])
def test_candidate_tree_scores_equal_one_forward_per_candidate(recall_llama, theta):
    build = S.prompt_builder(recall_llama.tokenizer)
    prompts = [build(6, seed) for seed in range(4)]
    assert all(len(c) == 2 for p in prompts for c in p.candidates)
    rule = S.Temperature() if theta is None else S.Temperature.fixed(theta)
    outcomes = S.score_chunk(recall_llama, prompts, rule, S.Recorder())
    for pr, outcome in zip(prompts, outcomes):
        ref = _reference_logprobs(recall_llama, pr, theta)
        assert outcome.correct == (max(range(len(ref)), key=ref.__getitem__) == pr.answer_index)
        assert math.isclose(outcome.prob, math.exp(ref[pr.answer_index]), rel_tol=1e-4)
    assert len(S.tree_nodes(prompts)) <= 10  # one node per first digit, not one forward per code


def test_the_tree_does_not_change_the_answer_rows_statistics(recall_llama):
    """The recorded row (the answer position) is the same with the candidate tree appended as without it."""
    prompts = [S.build_prompt(recall_llama.tokenizer, 6, seed) for seed in range(3)]
    with_tree = S.Recorder()
    S.score_chunk(recall_llama, prompts, S.Temperature.adaptive(), with_tree)
    plain = S.Recorder()
    S.tempered_logits(recall_llama, torch.tensor([p.input_ids for p in prompts]), S.Temperature.adaptive(), plain)
    t = len(prompts[0].input_ids)
    for layer in plain.probs:
        assert torch.allclose(with_tree.probs[layer][..., :t], plain.probs[layer], atol=1e-6)
        assert float(with_tree.probs[layer][..., t:].abs().max()) == 0.0
        assert torch.allclose(with_tree.beta[layer], plain.beta[layer], atol=1e-5)


# --- the rules own their settings ------------------------------------------------------------------


def test_adaptive_threshold_reaches_the_analysis_from_the_command_line(recall_llama_dir, capsys):
    base = ["--model", f"local:{recall_llama_dir}", "--n", "4", "--samples", "2", "--thetas", "", "--json"]
    assert S.cli(base) == 0
    default = S.SweepResult.from_dict(json.loads(capsys.readouterr().out))
    assert S.cli(base + ["--min-entropy", "9.5"]) == 0
    high = S.SweepResult.from_dict(json.loads(capsys.readouterr().out))
    rule = high.points[0].run("adaptive θ").rule
    assert rule.settings == {"min_entropy": 9.5} and rule.rule.min_entropy == 9.5
    assert high.params.rules == {"adaptive": {"min_entropy": 9.5}}
    # every row's entropy is below 9.5 nats, so nothing is sharpened any more
    assert all(b == 1.0 for row in high.points[0].run("adaptive θ").with_sink.beta for b in row)
    assert any(b > 1.0 for row in default.points[0].run("adaptive θ").with_sink.beta for b in row)


def test_adaptive_threshold_reaches_the_analysis_from_the_link(tiny_llama_dir):
    from conftest import app_with_model

    def beta_note(query):
        at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), "views/attention_sharpness.py", query)
        assert not at.exception and not at.error, [e.value for e in at.error]
        # the β note is drawn in the "Your own prompt" section (later sections are shown one at a time)
        at.segmented_control(key="sh_chapter").set_value("Your own prompt").run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        return next(c.value for c in at.caption if "β applied" in c.value), at

    default, _ = beta_note({"ns": "4,8", "samples": "2", "layer": "1", "head": "0"})
    raised, at = beta_note({"ns": "4,8", "samples": "2", "layer": "1", "head": "0", "min_entropy": "9.5"})
    assert raised.endswith("1.000.") and raised != default
    assert at.number_input(key="sh_min_entropy").value == 9.5
    assert str(at.query_params["min_entropy"]).strip("[]'") == "9.5"


def test_a_link_out_of_range_gets_the_command_lines_message(tiny_llama_dir):
    from conftest import app_with_model

    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), "views/attention_sharpness.py",
                        {"ns": "4", "samples": "2", "min_entropy": "-3"})
    assert not at.exception
    assert any("must be at least 0" in e.value for e in at.error), [e.value for e in at.error]


def test_unknown_rule_settings_are_refused():
    with pytest.raises(S.SharpnessError, match="No temperature rule has the setting"):
        S.rule_settings(bogus=1)
    with pytest.raises(S.SharpnessError, match="has no setting"):
        S.Temperature("adaptive", {"theta": 0.5})


# --- saved analyses of the earlier layout ------------------------------------------------------------


def test_a_saved_analysis_of_the_flat_rule_layout_still_opens(tiny_llama):
    res = S.size_sweep(tiny_llama, S.SweepParams(ns=[4], thetas=[0.5], samples=1))
    data = res.to_dict()
    for run in data["points"][0]["runs"]:  # as saved before the rules owned their settings
        rule = run["rule"]
        run["rule"] = {"mode": rule["mode"], "theta": rule["settings"].get("theta", 1.0), "layers": rule["layers"]}
    for key in ("rules",):
        data["params"].pop(key)
    for key in ("task", "candidates", "answer_index", "keys", "chat"):
        data["example"].pop(key)
    data.pop("task")
    old = S.SweepResult.from_dict(data)
    assert old.rules() == res.rules() == ["softmax", "adaptive θ", "θ = 0.5"]
    assert old.points[0].run("θ = 0.5").rule == S.Temperature.fixed(0.5)
    assert old.accuracy_table() == res.accuracy_table()
    prompt = S.PromptParams.from_dict({"text": "w1 w2", "target": "", "rule": {"mode": "fixed", "theta": 2.0,
                                                                               "layers": [1]}})
    assert prompt.rule == S.Temperature.fixed(2.0, layers=(1,))


# --- the real trained model, when it is converted on this machine -----------------------------------

REAL_LM = "smollm2-135m-instruct"


def _real_lm_built() -> bool:
    try:
        from analysis.model_access import real_models
    except ImportError:
        return False
    return real_models.is_built(REAL_LM)


@pytest.mark.skipif(not _real_lm_built(), reason=f"zoo:{REAL_LM} is not converted here (python -m analysis.zoo "
                                                   f"build --only {REAL_LM}); the suite never converts it")
def test_a_real_instruct_lm_answers_recall_well_above_chance(capsys):
    from analysis.__main__ import main

    code = main(["sharpness", "--model", f"zoo:{REAL_LM}", "--n", "4", "--samples", "8", "--thetas", "", "--json"])
    assert code == 0
    point = S.SweepResult.from_dict(json.loads(capsys.readouterr().out)).points[0]
    assert point.chance == 0.25 and point.run("softmax").accuracy >= 2 * point.chance
