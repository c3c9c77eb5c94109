"""Each eviction policy against an independent float64 reference written from its official code: the
entries kept per KV head *and* the entries the current query attends to per query head (the timing), at
every step, on random logits (GQA) and through the real runner on a tiny GQA Llama and the demo LM.

The references never call analysis.kv. They see attention *logits* L(q, h, k) (query position, query
head, key position), as the official code does, and compute every softmax themselves. Sources (file
paths in each paper's repository, commit and lines as cited in docs/readme_kv.md):

    StreamingLLM  mit-han-lab/streaming-llm  streaming_llm/kv_cache.py  StartRecentKVCache.__call__
    H2O           FMInference/H2O@0ee6a85  h2o_hf/utils_real_drop/modify_llama.py  H2OKVCache_LayerWise
    TOVA          schwartz-lab-NLP/TOVA  src/tova_cache.py  TOVACache.reduce
    SnapKV        FasterDecoding/SnapKV  snapkv/monkeypatch/snapkv_utils.py  SnapKVCluster.update_kv
    PyramidKV     Zefan-Cai/PyramidKV@5d4e2e1  pyramidkv/pyramidkv_utils.py  PyramidKVCluster.update_kv l. 197-283
    MorphKV       ghadiaravi13/MorphKV@36fefc7  morphkv/models/patch_llama.py  morphkv_mask l. 215-244, forward l. 312-337
    MorphKV 8903  ghadiaravi13/MorphKV@8903d2a  morphkv/models/patch_llama.py  morphkv_mask l. 216-263

Timing: every policy but MorphKV evicts after the current query attends (its query sees the previous
step's entries plus its own); MorphKV masks the current query's logits first (36fefc7 l. 244, 8903d2a
l. 263), so its query sees only the selection, per query head.
"""
from __future__ import annotations

import math

import pytest
import torch

from analysis.model_access import anatomy
from analysis import kv
from analysis.model_access.models import ModelSpec, load_model, zoo_models

PROMPT, STEPS, BUDGET, WINDOW, SINKS, KERNEL = 24, 6, 12, 4, 2, 3
SETTINGS = dict(sinks=SINKS, heavy_share=0.5, snap_window=WINDOW, kernel=KERNEL, morph_window=WINDOW)
MORPH = ("morphkv", "morphkv_8903d2a")


def softmax(values: dict[int, float]) -> dict[int, float]:
    top = max(values.values())
    ex = {k: math.exp(v - top) for k, v in values.items()}
    total = sum(ex.values())
    return {k: e / total for k, e in ex.items()}


def top(scores: dict[int, float], n: int) -> list[int]:
    return sorted(scores, key=lambda j: -scores[j])[:n] if n > 0 else []


def pyramid_schedule(capacity: int, window: int, q_len: int, n_layers: int, beta: int = 20) -> list[int] | None:
    """pyramidkv_utils.py l. 205-238 (PyramidKVCluster.update_kv): entries each layer keeps after the prompt
    (older ones plus the window); None: the prompt is not compressed (q_len < max_capacity_prompt)."""
    min_num = (capacity - window) // beta
    max_num = (capacity - window) * 2 - min_num
    if max_num >= q_len - window:
        max_num = q_len - window
        min_num = (capacity - window) * 2 - max_num
    steps = (max_num - min_num) // (n_layers - 1)
    if q_len < capacity:
        return None
    if q_len < (capacity - window) * 2:
        return [capacity] * n_layers  # SnapKV's uniform selection: max_capacity_prompt - window + window
    return [max_num - layer * steps + window for layer in range(n_layers)]


class Reference:
    """One layer of one policy, recomputed from logits: kept positions per KV head and attended positions
    per query head after each forward."""

    def __init__(self, policy: str, settings: dict, heads: int, kv_heads: int, budget: int, logit):
        self.policy, self.s, self.hq, self.hkv, self.C = policy, settings, heads, kv_heads, budget
        self.g = heads // kv_heads
        self.logit = logit  # logit(q, h, k) -> float
        self.kept: list[list[int]] = [[] for _ in range(kv_heads)]
        self.hh: list[dict[int, float]] = [{} for _ in range(heads)]  # H2O accumulated score per query head
        self.queries: list[int] = []  # every query position seen, in order

    def heads(self, g: int) -> range:
        return range(g * self.g, (g + 1) * self.g)

    def probs(self, q: int, h: int, cands: list[int]) -> dict[int, float]:
        """Softmax of query q (head h) over the cached keys it may see (causal)."""
        return softmax({k: self.logit(q, h, k) for k in cands if k <= q})

    def forward(self, new: list[int], phase: str) -> tuple[list[list[int]], list[list[int]]]:
        """(kept per KV head, attended by the last new query per query head) after one forward."""
        self.queries += new
        cands = [sorted(self.kept[g] + new) for g in range(self.hkv)]
        if self.policy in MORPH and phase == "decode" and len(cands[0]) > self.C:
            self.kept, attend = self.morph(cands)
            return self.kept, attend
        attend = [cands[h // self.g] for h in range(self.hq)]  # "after": every entry present, its own included
        self.kept = [self.choose(cands, g, new, phase) for g in range(self.hkv)]
        return self.kept, attend

    def choose(self, all_cands: list[list[int]], g: int, new: list[int], phase: str) -> list[int]:
        p, s, C, cands = self.policy, self.s, self.C, all_cands[g]
        if p == "h2o":  # accumulate before deciding, every forward (H2OKVCache_LayerWise._update_hh_score)
            for h in self.heads(g):
                self.hh[h] = {k: self.hh[h].get(k, 0.0) for k in cands}
                for q in new:
                    for k, v in self.probs(q, h, cands).items():
                        self.hh[h][k] += v
        if p in ("full", *MORPH) or len(cands) <= C:  # MorphKV: only while generating (hidden_states.shape[1] == 1)
            return cands
        if p == "streaming_llm":  # keep [0, start_size) and [seq_len - recent_size, seq_len)
            return cands[: s["sinks"]] + cands[len(cands) - (C - s["sinks"]):]
        if p == "tova":  # mean over all heads of the last query's attention, top cache_size
            last = new[-1]
            score = {k: 0.0 for k in cands}
            for h in range(self.hq):
                for k, v in self.probs(last, h, all_cands[h // self.g]).items():
                    score[k] += v / self.hq
            return sorted(top(score, C))
        if p == "h2o":  # top hh_size of hh_score[:seq_len - recent_size] + the last recent_size
            heavy = round(C * s["heavy_share"])
            recent = C - heavy
            old = cands[: len(cands) - recent]
            score = {k: sum(self.hh[h][k] for h in self.heads(g)) for k in old}
            kept = sorted(top(score, heavy) + cands[len(cands) - recent:])
            for h in self.heads(g):
                self.hh[h] = {k: self.hh[h][k] for k in kept}
            return kept
        if p in ("snapkv", "snapkv_prefill"):
            if phase != "prefill" and p == "snapkv_prefill":
                return cands
            w, ksz = s["snap_window"], s["kernel"]
            window = self.queries[-w:]  # the last w queries: the prompt's at prefill, the latest at decode
            old = cands[: len(cands) - w]
            votes = [0.0] * len(old)  # attn_weights[..., -w:, :-w].sum(-2), summed over the group
            for h in self.heads(g):
                for q in window:
                    pr = self.probs(q, h, cands)
                    for i, k in enumerate(old):
                        votes[i] += pr.get(k, 0.0)
            half = ksz // 2  # F.avg_pool1d(kernel, padding=kernel // 2, stride=1): zero padding counted
            pooled = {old[i]: sum(votes[i + d] for d in range(-half, half + 1) if 0 <= i + d < len(old)) / ksz
                      for i in range(len(old))}
            return sorted(top(pooled, C - w) + cands[len(cands) - w:])
        raise AssertionError(p)

    def morph(self, cands: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
        """morphkv_mask at a decode step, before the current query attends (MAX_CAPACITY = C - 1)."""
        W, fusion = self.s["morph_window"], self.s["fusion"]
        if self.policy == "morphkv":  # 36fefc7: update_win_queries keeps the last WIN_SIZE queries (current
            rows = self.queries[-W:][:-1]  # included); scores[:, :, -(WIN_SIZE+1):-1] drops the current one
        else:  # 8903d2a: cat(attn_cache (WIN_SIZE rows), current row)[:, :, -(WIN_SIZE+1):-1]
            rows = self.queries[-(W + 1):][:-1]
        n_top = (self.C - 1) - W  # topk(k = MAX_CAPACITY - WIN_SIZE)

        def fuse(per_row: list[dict[int, float]], old: list[int]) -> dict[int, float]:
            if fusion == "max":
                return {k: max(r[k] for r in per_row) for k in old}
            return {k: sum(r[k] for r in per_row) for k in old}

        def per_head(h: int, old: list[int]) -> list[dict[int, float]]:  # softmax over the older tokens, per row
            return [softmax({k: self.logit(q, h, k) for k in old}) for q in rows]

        kept = []
        for g in range(self.hkv):
            old = cands[g][: len(cands[g]) - (W + 1)]  # [..., :-(WIN_SIZE+1)]
            if self.policy == "morphkv":  # per-head softmax, then .max(dim=2) over the group's query heads
                heads = [per_head(h, old) for h in self.heads(g)]
                grouped = [{k: max(hd[i][k] for hd in heads) for k in old} for i in range(len(rows))]
            else:  # .view(b, key_heads, -1, q, k).sum(dim=2), then one softmax over the older tokens
                grouped = [softmax({k: sum(self.logit(q, h, k) for h in self.heads(g)) for k in old}) for q in rows]
            kept.append(sorted(top(fuse(grouped, old), n_top) + cands[g][len(cands[g]) - (W + 1):]))
        attend = []  # init_mask_attn: per query head, its own top plus the last WIN_SIZE + 1
        for h in range(self.hq):
            c = cands[h // self.g]
            old = c[: len(c) - (W + 1)]
            attend.append(sorted(top(fuse(per_head(h, old), old), n_top) + c[len(c) - (W + 1):]))
        return kept, attend


# ------------------------------------------------------------------------------------------------
# The policies driven on random logits, as the runner drives them


def drive(policy: kv.Policy, logit, prompt: int, steps: int, heads: int, kv_heads: int, layer: int = 0,
          n_layers: int = 1) -> list[tuple[list[list[int]], list[list[int]]]]:
    """Feed one layer of `policy` what the runner would give it for logits L; return, after each forward
    (prefill, then one per decode step), (kept positions per KV head, positions the last query attended
    to per query head)."""
    g = heads // kv_heads
    state = kv.LayerState(positions=torch.arange(prompt).expand(1, kv_heads, -1).clone(), phase="prefill",
                          groups=g, n_layers=n_layers, prompt_len=prompt)
    out, first, seen = [], 0, []
    for step in range(steps + 1):
        if step:
            new = torch.full((1, kv_heads, 1), prompt + step - 1)
            state.positions = torch.cat([state.positions, new], dim=-1)
            state.phase, first = "decode", prompt + step - 1
        pos = state.positions[0]
        queries = list(range(first, prompt + step if step else prompt))
        seen += queries
        present = [pos[h // g].tolist() for h in range(heads)]
        selection = None
        if policy.timing == "before" and state.phase == "decode":
            cached = seen[-policy.query_window():]
            logits = torch.tensor([[[[logit(q, h, k) for k in present[h]] for q in cached] for h in range(heads)]],
                                  dtype=torch.float64)
            selection = policy.select_before(layer, logits, state)
        if selection is not None:
            keep = selection.keep
            idx = selection.attend[0] if selection.attend is not None else keep[0].repeat_interleave(g, dim=0)
            attend = [[present[h][j] for j in idx[h].tolist()] for h in range(heads)]
        else:
            attend = present
            keep = None
            if policy.timing == "after":
                attn = torch.zeros(1, heads, len(queries), pos.shape[-1], dtype=torch.float64)
                for h in range(heads):
                    for i, q in enumerate(queries):
                        row = softmax({j: logit(q, h, k) for j, k in enumerate(present[h]) if k <= q})
                        for j, v in row.items():
                            attn[0, h, i, j] = v
                keep = policy.select(layer, attn.float(), state)
        if keep is not None:
            state.positions = state.positions.gather(-1, keep)
        out.append(([row.tolist() for row in state.positions[0]], attend))
    return out


def random_logits(seed: int, scale: float = 3.0, size: int = 64):
    g = torch.Generator().manual_seed(seed)
    table = (scale * torch.randn(size, 8, size, generator=g, dtype=torch.float64)).tolist()
    return lambda q, h, k: table[q][h][k]


def _params(policy: str, **kw) -> kv.KvParams:
    task = {k: v for k, v in kw.items() if k in kv.KvParams.__dataclass_fields__}
    settings = {k: v for k, v in {**SETTINGS, **kw}.items() if k not in task}
    return kv.KvParams(**{"policy": policy, "budget": BUDGET, **task}, policies=kv.policy_settings(**settings))


def _compare(got, ref: Reference, prompt: int, label) -> None:
    for step, (kept, attend) in enumerate(got):
        first = 0 if step == 0 else prompt + step - 1
        new = list(range(first, prompt)) if step == 0 else [first]
        exp_kept, exp_attend = ref.forward(new, "prefill" if step == 0 else "decode")
        assert kept == exp_kept, (label, step, "kept")
        if step:
            assert attend == exp_attend, (label, step, "attended")


EXACT = ["streaming_llm", "h2o", "tova", "snapkv", "snapkv_prefill", *MORPH]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy,fusion", [(p, "max") for p in EXACT] + [(p, "sum") for p in MORPH])
def test_kept_and_attended_sets_match_the_official_rule_on_random_logits(policy, fusion, seed):
    heads, kv_heads, prompt, steps = 8, 2, 30, 16  # GQA: 4 query heads per KV head
    settings = {**SETTINGS, "fusion": fusion, "heavy_share": [0.5, 0.25, 0.75][seed % 3],
                "morph_window": [4, 3, 6][seed % 3]}
    logit = random_logits(seed)
    pol = kv.make_policy(kv.KvParams(policy=policy, budget=BUDGET, policies=kv.policy_settings(**settings)))
    got = drive(pol, logit, prompt, steps, heads, kv_heads)
    _compare(got, Reference(policy, settings, heads, kv_heads, BUDGET, logit), prompt, (policy, seed))


def test_morphkv_rules_differ_and_attend_per_query_head():
    """On random GQA logits the release rule and the 8903d2a rule keep different sets, and MorphKV's current
    query heads each see their own selection (not the KV cache's), so a head may see an entry the cache drops."""
    heads, kv_heads, prompt, steps = 8, 2, 30, 12
    differ = own = 0
    for seed in range(4):
        logit = random_logits(100 + seed)
        release = drive(kv.make_policy(_params("morphkv")), logit, prompt, steps, heads, kv_heads)
        later = drive(kv.make_policy(_params("morphkv_8903d2a")), logit, prompt, steps, heads, kv_heads)
        differ += sum(a[0] != b[0] for a, b in zip(release[1:], later[1:]))
        for kept, attend in release[1:]:
            assert all(len(k) == BUDGET for k in kept) and all(len(a) == BUDGET for a in attend)
            own += sum(set(a) != set(kept[h // 4]) for h, a in enumerate(attend))
    assert differ > 0 and own > 0


@pytest.mark.parametrize("capacity,q_len", [(16, 12), (16, 20), (16, 40), (24, 40), (20, 33), (12, 200)])
def test_pyramidkv_follows_its_official_schedule(capacity, q_len):
    """Per-layer entries after the prompt: none compressed below C, SnapKV's uniform C below 2(C - w),
    the pyramid above, each layer then held at its entries while decoding, and its kept set SnapKV's at
    that layer's budget."""
    heads, kv_heads, n_layers, steps = 4, 2, 4, 6
    pol = kv.make_policy(_params("pyramidkv", budget=capacity))
    expected = pyramid_schedule(capacity, WINDOW, q_len, n_layers)
    for layer in range(n_layers):
        logit = random_logits(7 + layer, size=q_len + steps + 1)
        got = drive(pol, logit, q_len, steps, heads, kv_heads, layer=layer, n_layers=n_layers)
        prefill = len(got[0][0][0])
        held = q_len if expected is None else expected[layer]
        assert prefill == held, (layer, prefill, held)
        c = capacity if expected is None else expected[layer]  # decoding: the layer's budget
        assert all(len(k) == min(q_len + s + 1, max(c, held)) for s, (kept, _) in enumerate(got[1:]) for k in kept)
        ref = Reference("snapkv", SETTINGS, heads, kv_heads, c, logit)
        _compare(got, ref, q_len, ("pyramidkv", layer))


def test_pyramidkv_holds_at_least_c_on_average():
    """The official schedule's integer steps round the pyramid up: the mean over layers is never below C
    (the steep schedule it replaced held 121 where the table said 142)."""
    pol = kv.make_policy(_params("pyramidkv", budget=142, snap_window=8))
    for n_layers in (2, 4, 30):
        for q_len in (94, 150, 283, 400, 1000):
            held = pol.held(n_layers, q_len, q_len + 5)
            assert sum(held) / n_layers >= min(142, q_len + 5), (n_layers, q_len, held)


# ------------------------------------------------------------------------------------------------
# Through the runner on a model: logits recomputed from the recorded hidden states


def _record(handle):
    """Per attention forward, in call order: (layer, q (H_q, n, d), k (H_kv, n, d), weights (H_q, n, T)), with q
    and k recomputed from the layer's input by its own projections and transformers' rotary embedding."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    calls, removers = [], []
    for layer, module in anatomy.attention_modules(handle.language_model).items():
        def pre(mod, args, kwargs, layer=layer):
            h = kwargs["hidden_states"]
            shape = (*h.shape[:-1], -1, mod.head_dim)
            q = mod.q_proj(h).view(shape).transpose(1, 2)
            k = mod.k_proj(h).view(shape).transpose(1, 2)
            cos, sin = kwargs["position_embeddings"]
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            calls.append([layer, q[0].double(), k[0].double(), None])

        def post(mod, args, output):
            calls[-1][3] = output[1][0].double()
        removers += [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post)]
    return calls, removers


def _check_model_run(handle, policy, fusion, tokens, prompt, budget):
    calls, removers = _record(handle)
    try:
        trace = kv.run_policy(handle, tokens, prompt, kv.make_policy(_params(policy, fusion=fusion, budget=budget)))
    finally:
        for r in removers:
            r.remove()
    layers = sorted(anatomy.attention_modules(handle.language_model))
    heads, kv_heads = handle.info.heads, handle.info.kv_heads
    g, scale = heads // kv_heads, handle.info.head_dim ** -0.5
    qs = {layer: {} for layer in layers}
    ks = {layer: {} for layer in layers}

    def logit_of(layer):
        return lambda q, h, k: float(qs[layer][q][h] @ ks[layer][k][h // g]) * scale

    refs = {layer: Reference(policy, {**SETTINGS, "fusion": fusion}, heads, kv_heads, budget, logit_of(layer))
            for layer in layers}
    forwards = [calls[i:i + len(layers)] for i in range(0, len(calls), len(layers))]
    assert len(forwards) == len(tokens) - prompt
    for step, forward in enumerate(forwards):
        first = 0 if step == 0 else prompt + step - 1
        new = list(range(first, prompt)) if step == 0 else [first]
        for layer, q, k, weights in forward:
            for i, pos in enumerate(new):
                qs[layer][pos], ks[layer][pos] = q[:, i], k[:, i]
            before = [sorted(refs[layer].kept[x] + new) for x in range(kv_heads)]
            kept, attend = refs[layer].forward(new, "prefill" if step == 0 else "decode")
            got = trace.prefill_kept[layer] if step == 0 else trace.kept[step - 1][layer]
            for x in range(kv_heads):
                assert got[x].tolist() == kept[x], (policy, step, layer, x)
            if step:  # the current query's attention: a softmax over exactly the entries the reference lets it see
                for h in range(heads):
                    row = dict(zip(before[h // g], weights[h, -1].tolist()))
                    expected = softmax({j: logit_of(layer)(new[-1], h, j) for j in attend[h]})
                    assert all(abs(row[j] - expected.get(j, 0.0)) < 1e-4 for j in row), (policy, step, layer, h)


@pytest.mark.parametrize("policy,fusion", [(p, "max") for p in EXACT] + [(p, "sum") for p in MORPH]
                         + [("full", "max"), ("pyramidkv", "max")])
def test_policy_kept_and_attended_sets_on_a_model_match_the_reference(tiny_llama, policy, fusion):
    """The runner on a GQA Llama (4 query / 2 KV heads, 2 layers): kept sets and the current query's
    attention at every step against the reference fed with the run's own queries and keys."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 120, (PROMPT + STEPS + 1,), generator=g).tolist()
    if policy == "pyramidkv":  # prompt 24 >= 2(C - w) = 16: the pyramid's per-layer entries
        _check_pyramid_run(tiny_llama, tokens)
    else:
        _check_model_run(tiny_llama, policy, fusion, tokens, PROMPT, BUDGET)


def _check_pyramid_run(handle, tokens):
    pol = kv.make_policy(_params("pyramidkv"))
    trace = kv.run_policy(handle, tokens, PROMPT, pol)
    expected = pyramid_schedule(BUDGET, WINDOW, PROMPT, 2)
    assert [t.shape[-1] for t in trace.prefill_kept] == expected
    assert all(lens == expected for lens in trace.cache_len)


@pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo LM")
@pytest.mark.parametrize("policy", ["morphkv", "morphkv_8903d2a", "h2o", "snapkv"])
def test_kept_sets_on_the_demo_model_match_the_reference(policy):
    handle = load_model(ModelSpec("zoo", "shapes-lm"))
    task = kv.build_task(handle, kv.KvParams(context=64, pairs=2, seed=3))
    _check_model_run(handle, policy, "max", task.tokens, task.prefill_len, 24)
