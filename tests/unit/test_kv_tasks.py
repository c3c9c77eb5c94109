"""The KV panel's tasks for real models: natural-language recall (facts in filler text asked through the
chat template) and the long-response list; a test vocabulary that cannot spell English gets token tasks."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from analysis import kv
from analysis.tasks.kv_recall import recall_task, speaks_english
from analysis.tasks.long_response import generic_list
from analysis.model_access import real_models


def _real_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (its chat template included), from the zoo or MODEL_INSPECTOR_REAL_LM."""
    from transformers import AutoTokenizer

    for folder in (os.environ.get("MODEL_INSPECTOR_REAL_LM"), real_models.folder("smollm2-135m-instruct")):
        if folder and (Path(folder) / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(str(folder))
    pytest.skip("needs SmolLM2-135M-Instruct's tokenizer (zoo:smollm2-135m-instruct or MODEL_INSPECTOR_REAL_LM)")


def test_a_word_level_test_vocabulary_gets_the_token_tasks(tiny_llama):
    assert not speaks_english(tiny_llama.tokenizer)
    task = kv.build_task(tiny_llama, kv.KvParams(context=48, pairs=2))
    assert task.source == "synthetic key-value recall"
    long = kv.longresp.long_task(tiny_llama, kv.KvParams(task="long-response"))
    assert not long.reference and long.kind == "custom"


def test_recall_task_states_facts_in_filler_and_asks_them_through_the_chat_template():
    tok = _real_tokenizer()
    assert speaks_english(tok)
    task = recall_task(tok, context=96, pairs=3, seed=4, queries=2, prefill=0.5)
    text = tok.decode(task.tokens)
    assert text.startswith("<|im_start|>system") and "<|im_start|>assistant\n" in text
    assert abs(task.context_len - 96) <= 16 and task.prefill_len == round(0.5 * task.context_len)
    assert len(task.answer_positions) == 2 == len(task.needle_positions)
    for answer, needle in zip(task.answer_positions, task.needle_positions):
        fact = tok.decode([task.tokens[i] for i in needle])  # " Mia lives in Tokyo."
        city = tok.decode([task.tokens[answer]]).strip()
        assert fact.strip().endswith(f"lives in {city}.") and max(needle) < task.context_len < answer
        name = fact.split()[0]
        assert tok.decode(task.tokens[answer - 4: answer]).strip().endswith(f"{name} lives in")
        assert f"{name}" in tok.decode(task.tokens[task.context_len: task.answer_positions[0]])  # asked


def test_list_task_gives_the_first_line_and_checks_the_others():
    tok = _real_tokenizer()
    task = generic_list(tok, seed=2, max_new=64)
    text = tok.decode(task.tokens)
    assert text.endswith("\n") and text.count("- ") >= 9 and len(task.reference) == 7
    first = text.rsplit("<|im_start|>assistant\n", 1)[1]
    assert first.startswith("- ") and all(r.split(": ")[0] in text for r in task.reference)
