"""No shared mutable state between runs (#50): several panels' runs from several threads on one shared model
give what a serial run gives, and a shared fast tokenizer pads and truncates per call under threads."""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from analysis import kv
from analysis import residual
from analysis import sharpness as S
from analysis.model_access.models import ModelSpec, load_model, zoo_models
from analysis.sae_v import prompts

pytestmark = pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo")
TEXTS = ["a red square", "two blue circles left of a green triangle above a small yellow square", "x"]


@pytest.fixture(scope="module")
def shared():
    return load_model(ModelSpec("zoo", "shapes-lm"))


def _hammer(tokenizer, rounds: int = 300) -> list[str]:
    """One thread pads a batch into a tensor while another encodes without padding and with truncation: the
    settings each call passes must be the ones its own encoding uses."""
    errors: list[str] = []

    def padded():
        for _ in range(rounds):
            try:
                out = tokenizer(TEXTS, padding=True, return_tensors="pt")
                assert out["input_ids"].shape[0] == 3
            except Exception as exc:  # noqa: BLE001  (what the race raises is the finding)
                errors.append(f"{type(exc).__name__}: {str(exc)[:80]}")

    def plain():
        for _ in range(rounds):
            lengths = [len(x) for x in tokenizer(TEXTS)["input_ids"]]
            if len(set(lengths)) == 1:
                errors.append(f"unpadded texts came back padded: {lengths}")
            if max(len(x) for x in tokenizer(TEXTS, truncation=True, max_length=2)["input_ids"]) > 2:
                errors.append("truncation was lost")

    threads = [threading.Thread(target=padded), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_a_shared_fast_tokenizer_keeps_each_calls_padding_under_threads(shared):
    assert hasattr(shared.tokenizer, "set_truncation_and_padding")  # a fast tokenizer: backend state per call
    assert _hammer(shared.tokenizer) == []


def _plain(value):
    """A result as comparable data: floats rounded, timings left out."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not any(t in k for t in ("second", "_ms", "elapsed", "started"))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    return value


JOBS = {
    "kv": lambda h: kv.analyze(h, kv.KvParams(context=48, budget=16, new_tokens=4,
                                              policies=kv.policy_settings(snap_window=4, morph_window=4))),
    "sharpness": lambda h: S.size_sweep(h, S.SweepParams(ns=[2, 4], samples=3, batch=2)),
    "residual": lambda h: residual.inspect(h, residual.ResidualParams()),
    "sae-v lengths": lambda h: [prompts.prompt_lengths(h, TEXTS * 20) for _ in range(30)][-1],
    "padded batch": lambda h: [h.tokenizer(TEXTS * 4, padding=True, return_tensors="pt")["input_ids"].tolist()
                               for _ in range(30)][-1],
}


def test_panels_run_from_several_threads_on_one_model_match_a_serial_run(shared):
    serial = {name: _plain(job(shared)) for name, job in JOBS.items()}
    with ThreadPoolExecutor(max_workers=2 * len(JOBS)) as pool:
        futures = [(name, pool.submit(job, shared)) for name, job in JOBS.items() for _ in range(2)]
        together = [(name, _plain(f.result())) for name, f in futures]
    for name, result in together:
        assert result == serial[name], name
