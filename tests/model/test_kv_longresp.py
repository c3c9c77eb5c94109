"""The long-response evaluation: every policy writes its own answer with its cache held at C from the
first generated token; compared with the full cache after the same prefix, checked item by item."""
from __future__ import annotations

import json

import pytest
import torch

from analysis.framework import cost
from analysis import kv
from analysis.model_access.models import ModelSpec, load_model, zoo_models
from analysis.tasks.long_response import LongTask, answer_items, recalled
from analysis.model_access.tiny_models import default_words
from analysis.world.tokenizer import make_word_tokenizer

SMALL = dict(budget=12, response=10, policies=kv.policy_settings(snap_window=4, morph_window=4, sinks=2))


@pytest.fixture(scope="module")
def result(tiny_llama):
    return kv.long_response(tiny_llama, kv.KvParams(task="long-response", policy="morphkv", **SMALL))


def test_every_main_policy_writes_its_own_answer_at_its_budget(result):
    assert [r.policy for r in result.runs] == kv.main_policies()
    full = result.runs[0]
    assert all(x == 1.0 for x in full.top1) and all(x == 1.0 for x in full.same) and max(full.kl) < 1e-6
    prompt = len(result.task.tokens)
    assert full.cache_len == [prompt + 1 + i for i in range(len(full.cache_len))]
    for r in result.runs[1:]:
        assert all(n <= max(12, prompt) for n in r.cache_len), r.policy
        assert r.cache_len[-1] == r.claimed, (r.policy, r.cache_len[-1], r.claimed)  # holds what it claims
        assert len(r.top1) == len(r.kl) == len(r.same) == len(r.generated)
        first = next((i for i, s in enumerate(r.same) if not s), len(r.same))
        assert r.generated[:first] == full.generated[:first]
    assert len(result.kept) == len(result.layers) and len(result.kept[0]) == result.kv_heads
    again = kv.LongResult.from_json(result.to_json())
    assert again.run("morphkv").top1 == result.run("morphkv").top1 and again.params == result.params


def test_top1_and_kl_compare_the_same_prefix(tiny_llama, result):
    """Independent check: the full model on the policy's own text, position by position."""
    r = result.run("h2o")
    p = len(result.task.tokens)
    tokens = result.task.tokens + r.generated
    with torch.no_grad():
        logits = tiny_llama.language_model(torch.tensor([tokens])).logits[0, p - 1: p - 1 + len(r.generated)]
    assert [float(int(x) == t) for x, t in zip(logits.argmax(-1), r.generated)] == r.top1


def test_a_budget_above_the_answer_changes_nothing(tiny_llama):
    res = kv.long_response(tiny_llama, kv.KvParams(task="long-response", **{**SMALL, "budget": 200}))
    full = res.runs[0]
    for r in res.runs[1:]:
        assert r.generated == full.generated and all(r.same), r.policy
        assert max(r.kl) < 1e-4, r.policy


def test_answers_end_at_end_of_text_and_the_estimate_counts_the_forwards(tiny_llama):
    params = kv.KvParams(task="long-response", **SMALL)
    work = cost.estimate_work(kv.long_response, tiny_llama, params)
    calls = []
    handle = tiny_llama.language_model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        res = kv.long_response(tiny_llama, params)
    finally:
        handle.remove()
    ended = sum(params.response - max(1, len(r.generated) + 1) for r in res.runs)  # steps not run after EOS
    assert len(calls) <= work.calls and len(calls) >= work.calls - ended - len(res.runs)


def test_items_are_found_with_the_position_where_they_end():
    words = ["there", "is", "a", "red", "circle", ";", "the", "circle", "square", "blue", "small", "is", "big"]
    tok = make_word_tokenizer(default_words() + words)
    task = LongTask(tokens=[1], source="t", reference=["there is a red circle", "the red circle is small"],
                    kind="decomposition")
    ids = tok("there is a red circle ; the red circle is big ; there is a blue square",
              add_special_tokens=False)["input_ids"]
    items = answer_items(task, tok, ids)
    assert [(i.text, i.end, i.correct) for i in items] == [
        ("there is a red circle", 4, True), ("the red circle is big", 10, False), ("there is a blue square", 16, False)]
    assert recalled(task, items) == [True, False]


def test_list_items_are_read_from_lines():
    from analysis.tasks.long_response import _normal

    assert _normal("list", "- Anna lives in Paris.") == "Anna: Paris"
    assert _normal("list", "Anna: Paris") == "Anna: Paris"
    assert _normal("list", "I am not sure.") == ""


@pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo LM")
def test_the_demo_lm_decomposes_with_the_full_cache():
    handle = load_model(ModelSpec("zoo", "shapes-lm"))
    res = kv.long_response(handle, kv.KvParams(task="long-response", budget=32), names=["morphkv"])
    full, morph = res.run("full"), res.run("morphkv")
    assert full.recall == 1.0 and full.precision == 1.0 and len(res.task.reference) == 12
    assert morph.cache_len == [32] * len(morph.cache_len) and morph.claimed == 32
    assert morph.cache_bytes[0] == morph.cache_bytes[-1] < full.cache_bytes[-1]


def test_cli_long_response_json(tiny_llama_dir, capsys):
    from analysis.__main__ import main

    rc = main(["kv", "--model", f"local:{tiny_llama_dir}", "--task", "long-response", "--budget", "12",
               "--response", "8", "--snap-window", "4", "--morph-window", "4", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in data["runs"]] == kv.main_policies()
    assert all(len(r["top1"]) == len(r["generated"]) for r in data["runs"])


def test_cli_refuses_a_long_response_sweep(capsys):
    from analysis.__main__ import main

    rc = main(["kv", "--model", "zoo:does-not-matter", "--task", "long-response", "--sweep"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "benchmarks/kv_longresp.py" in err[0]
