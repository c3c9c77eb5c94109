"""The backend seam on tiny models: every site, write, gradient and the early stop, by hooks and by nnsight,
against references computed without the seam (transformers' own outputs and plain autograd)."""
from __future__ import annotations

import pytest
import torch

from analysis.model_access import anatomy
from analysis import backends
from analysis.backends import LogitMetric, Request, Site, Write, native, traced
from analysis.backends.plan import plan

BACKENDS = ["local", "nnsight-local"]


def _ids(handle, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, handle.info.vocab_size, (2, n), generator=g)


def _run(name, handle, request):
    with backends.using(name):
        got = backends.run(handle, request)
    assert got.backend == name
    return got


@pytest.fixture
def handle(request):
    """The tiny model named by the test's parameter, built in the test's setup (where --durations counts
    it: the first tiny model of a session pays for importing transformers' modelling code)."""
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("handle", ["tiny_llama", "tiny_gpt2"], indirect=True)
def test_reads_equal_transformers_own_hidden_states_and_attentions(name, handle):
    x = _ids(handle)
    with handle.session():
        ref = handle.model(input_ids=x, output_hidden_states=True, output_attentions=True)
    n = handle.info.layers
    sites = [Site("block_out", 1), Site("block_in", 0), Site("attn_weights", 0), Site("block_out", 0)]  # out of order
    got = _run(name, handle, Request(inputs={"input_ids": x}, reads=tuple(sites), logits=0))
    assert torch.equal(got[Site("block_in", 0)], ref.hidden_states[0])
    assert torch.equal(got[Site("block_out", 0)], ref.hidden_states[1])
    if n > 2:  # the last hidden state is after the final norm
        assert torch.equal(got[Site("block_out", 1)], ref.hidden_states[2])
    assert torch.equal(got[Site("attn_weights", 0)], ref.attentions[0])
    assert torch.equal(got.logits, ref.logits)


@pytest.mark.parametrize("name", BACKENDS)
def test_module_sites_equal_plain_hooks(name, tiny_llama):
    x = _ids(tiny_llama)
    seen = {}
    attn = anatomy.attention_modules(tiny_llama.model)[1]
    hooks = [attn.register_forward_hook(lambda m, a, o: seen.__setitem__("attn", o[0])),
             anatomy.mlp_module(tiny_llama.model, 1).register_forward_hook(lambda m, a, o: seen.__setitem__("mlp", o)),
             anatomy.output_projection(tiny_llama.model, 1).register_forward_pre_hook(
                 lambda m, a: seen.__setitem__("heads", a[0])),
             anatomy.final_norm(tiny_llama.model).register_forward_hook(lambda m, a, o: seen.__setitem__("norm", o))]
    try:
        with tiny_llama.session():
            tiny_llama.model(input_ids=x)
    finally:
        for h in hooks:
            h.remove()
    sites = (Site("final_norm"), Site("mlp_out", 1), Site("heads", 1), Site("attn_out", 1))
    got = _run(name, tiny_llama, Request(inputs={"input_ids": x}, reads=sites))
    layout = anatomy.head_layout(tiny_llama.model)
    assert torch.equal(got[Site("attn_out", 1)], seen["attn"])
    assert torch.equal(got[Site("mlp_out", 1)], seen["mlp"])
    assert torch.equal(got[Site("heads", 1)], seen["heads"].reshape(2, x.shape[1], layout.heads, layout.head_dim))
    assert torch.equal(got[Site("final_norm")], seen["norm"])


@pytest.mark.parametrize("name", BACKENDS)
def test_a_capture_stops_after_the_last_layer_it_needs(name, tiny_llama):
    calls = []
    last = anatomy.decoder_layers(tiny_llama.model)[-1]
    hook = last.register_forward_hook(lambda *a: calls.append(1))
    try:
        _run(name, tiny_llama, Request(inputs={"input_ids": _ids(tiny_llama)}, reads=(Site("block_out", 0),)))
        assert calls == []
        _run(name, tiny_llama, Request(inputs={"input_ids": _ids(tiny_llama)}, reads=(Site("block_out", 0),), logits=1))
        assert calls == [1]
    finally:
        hook.remove()


def _patched_reference(handle, x, module, value, positions, head=None, dh=0, pre=False):
    def post(m, a, o):
        out = (o[0] if isinstance(o, tuple) else o).clone()
        cols = slice(None) if head is None else slice(head * dh, (head + 1) * dh)
        out[:, list(positions), cols] = value
        return (out, *o[1:]) if isinstance(o, tuple) else out

    def before(m, a):
        return (post(m, None, a[0]), *a[1:])

    h = module.register_forward_pre_hook(before) if pre else module.register_forward_hook(post)
    try:
        with handle.session():
            return handle.model(input_ids=x).logits
    finally:
        h.remove()


@pytest.mark.parametrize("name", BACKENDS)
def test_writes_patch_the_residual_and_one_head_like_a_plain_hook(name, tiny_llama):
    x = _ids(tiny_llama)
    d = tiny_llama.info.hidden_size
    value = torch.linspace(-1, 1, d)
    block = anatomy.decoder_layers(tiny_llama.model)[0]
    ref = _patched_reference(tiny_llama, x, block, value, (2, 4))
    got = _run(name, tiny_llama, Request(inputs={"input_ids": x}, logits=0,
                                         writes=(Write(Site("block_out", 0), value, positions=(2, 4)),)))
    assert torch.equal(got.logits, ref)
    dh = tiny_llama.info.head_dim
    head_value = torch.full((dh,), 0.5)
    oproj = anatomy.output_projection(tiny_llama.model, 1)
    ref = _patched_reference(tiny_llama, x, oproj, head_value, (3,), head=2, dh=dh, pre=True)
    got = _run(name, tiny_llama, Request(inputs={"input_ids": x}, logits=0,
                                         writes=(Write(Site("heads", 1), head_value, positions=(3,), head=2),)))
    assert torch.equal(got.logits, ref)
    clean = _run(name, tiny_llama, Request(inputs={"input_ids": x}, logits=0)).logits
    assert not torch.equal(clean, ref)  # the patch changed something


@pytest.mark.parametrize("name", BACKENDS)
def test_gradients_of_a_logit_difference_equal_autograd(name, tiny_llama):
    x = _ids(tiny_llama)
    layers = anatomy.decoder_layers(tiny_llama.model)
    kept = {}
    hooks = [layers[i].register_forward_hook(lambda m, a, o, i=i: kept.__setitem__(i, o)) for i in range(2)]
    try:
        with tiny_llama.lock, torch.enable_grad():
            logits = tiny_llama.model(input_ids=x).logits
            metric = logits[:, -1, 7].sum() - logits[:, -1, 9].sum()
            ref = torch.autograd.grad(metric, [kept[0], kept[1]])
    finally:
        for h in hooks:
            h.remove()
    sites = (Site("block_out", 0), Site("block_out", 1))
    got = _run(name, tiny_llama, Request(inputs={"input_ids": x}, grads=sites,
                                         metric=LogitMetric(-1, plus=(7,), minus=(9,))))
    for site, expected in zip(sites, ref):
        assert torch.allclose(got.grads[site], expected, atol=1e-6)
    assert float(got.grads[sites[0]].abs().sum()) > 0


def _rows_patched_reference(handle, x, edits):
    """Logits with `edits` [(module, pre, row, positions or None, cols, source row or value)] applied by plain
    hooks written here, one at a time, each copy reading the value as it arrived at the module."""
    def apply(t, mine):
        out = t.clone()
        for _, _, row, positions, cols, what in mine:
            where = slice(None) if positions is None else list(positions)
            out[row, where, cols] = t[what, where, cols] if isinstance(what, int) else what
        return out

    hooks = []
    for module in {id(e[0]): e[0] for e in edits}.values():
        mine = [e for e in edits if e[0] is module]
        if mine[0][1]:
            hooks.append(module.register_forward_pre_hook(lambda m, a, mine=mine: (apply(a[0], mine), *a[1:])))
        else:
            hooks.append(module.register_forward_hook(
                lambda m, a, o, mine=mine: (apply(o[0], mine), *o[1:]) if isinstance(o, tuple) else apply(o, mine)))
    try:
        with handle.session():
            return handle.model(input_ids=x).logits
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize("name", BACKENDS)
def test_per_row_writes_copy_from_another_row_of_the_same_forward_like_plain_hooks(name, tiny_llama):
    """Row 0 is a clean prompt; rows 1-3 a corrupted one, each patched at its own place from row 0 (a run
    of one-row copies becomes one indexed copy), plus a value written into chosen rows and positions."""
    clean, corrupt = _ids(tiny_llama, seed=1)[:1], _ids(tiny_llama, seed=2)[:1]
    x = torch.cat([clean, corrupt.expand(3, -1)])
    dh, d = tiny_llama.info.head_dim, tiny_llama.info.hidden_size
    blocks = anatomy.decoder_layers(tiny_llama.model)
    oproj = anatomy.output_projection(tiny_llama.model, 1)
    value = torch.linspace(-1, 1, d)
    writes = (Write(Site("block_out", 0), rows=(1,), positions=(2,), source=0),
              Write(Site("block_out", 0), rows=(2,), positions=(5,), source=0),
              Write(Site("block_out", 0), rows=(3,), positions=(0,), source=0),
              Write(Site("heads", 1), rows=(2,), head=1, source=0),
              Write(Site("heads", 1), rows=(3,), head=3, source=0),
              Write(Site("block_out", 1), value, rows=(1, 3), positions=(4, 6)))
    ref = _rows_patched_reference(tiny_llama, x, [
        (blocks[0], False, 1, (2,), slice(None), 0), (blocks[0], False, 2, (5,), slice(None), 0),
        (blocks[0], False, 3, (0,), slice(None), 0), (oproj, True, 2, None, slice(dh, 2 * dh), 0),
        (oproj, True, 3, None, slice(3 * dh, 4 * dh), 0), (blocks[1], False, [[1], [3]], (4, 6), slice(None), value)])
    got = _run(name, tiny_llama, Request(inputs={"input_ids": x}, logits=0, writes=writes))
    assert torch.equal(got.logits, ref)
    plain = _run(name, tiny_llama, Request(inputs={"input_ids": x}, logits=0)).logits
    assert torch.equal(got.logits[0], plain[0])  # the source row itself is untouched
    assert all(not torch.equal(got.logits[r], plain[r]) for r in (1, 2, 3))
    with pytest.raises(ValueError, match="either a value or a source row"):
        Write(Site("block_out", 0))


@pytest.mark.parametrize("name", BACKENDS)
def test_gradients_at_the_embeddings_heads_and_mlp_of_chosen_rows_equal_autograd(name, tiny_llama):
    x = _ids(tiny_llama)
    kept = {}
    model = tiny_llama.model
    hooks = [anatomy.decoder_layers(model)[0].register_forward_pre_hook(
                 lambda m, a, k: kept.__setitem__("in", k["hidden_states"] if not a else a[0]), with_kwargs=True),
             anatomy.output_projection(model, 1).register_forward_pre_hook(lambda m, a: kept.__setitem__("heads", a[0])),
             anatomy.mlp_module(model, 0).register_forward_hook(lambda m, a, o: kept.__setitem__("mlp", o))]
    try:
        with tiny_llama.lock, torch.enable_grad():
            logits = model(input_ids=x).logits
            metric = logits[1, -1, 7] - logits[1, -1, 9]  # the second row only
            ref = torch.autograd.grad(metric, [kept["in"], kept["heads"], kept["mlp"]])
    finally:
        for h in hooks:
            h.remove()
    sites = (Site("block_in", 0), Site("heads", 1), Site("mlp_out", 0))
    request = Request(inputs={"input_ids": x}, grads=sites, logits=1,
                      metric=LogitMetric(-1, plus=(7,), minus=(9,), rows=(1,)))
    layout = anatomy.head_layout(model)
    embed = anatomy.input_embeddings(model).weight
    for frozen in (False, True):  # frozen embeddings: the graph starts at the site
        embed.requires_grad_(not frozen)
        try:
            got = _run(name, tiny_llama, request)
        finally:
            embed.requires_grad_(True)
        assert torch.allclose(got.grads[sites[0]], ref[0], atol=1e-6)
        assert torch.allclose(got.grads[sites[1]], ref[1].reshape(*x.shape, layout.heads, layout.head_dim), atol=1e-6)
        assert torch.allclose(got.grads[sites[2]], ref[2], atol=1e-6)
        assert float(got.grads[sites[0]][0].abs().sum()) == 0 < float(got.grads[sites[0]][1].abs().sum())
        assert all(p.grad is None for p in model.parameters())  # nothing accumulated on the shared weights


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("family", ["gemma2", "opt"])
def test_attention_and_mlp_sites_are_what_each_layer_adds_to_the_residual(name, family):
    """Gemma 2 norms what attention and the MLP add ("sandwich" norms); OPT's MLP is fc2 on (B * T, D) rows:
    block_in + attn_out + mlp_out is block_out on both, and a per-row write reaches OPT's flat rows."""
    from analysis.model_access import tiny_models
    from analysis.model_access.models import ModelHandle, ModelSpec, describe

    model, tok, _ = tiny_models.build_tiny(family)
    handle = ModelHandle(spec=ModelSpec("local", f"tiny-{family}"), model=model, kind="causal_lm",
                         info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)
    x = _ids(handle)
    sites = tuple(Site(k, 0) for k in ("block_in", "attn_out", "mlp_out", "block_out"))
    got = _run(name, handle, Request(inputs={"input_ids": x}, reads=sites))
    parts = [got[s] for s in sites]
    assert all(p.shape == (*x.shape, handle.info.hidden_size) for p in parts)
    assert torch.allclose(parts[0] + parts[1] + parts[2], parts[3], atol=1e-5)
    write = Write(Site("mlp_out", 0), rows=(1,), positions=(3,), source=0)
    patched = _run(name, handle, Request(inputs={"input_ids": x}, reads=(Site("block_out", 0),), writes=(write,)))
    expected = parts[3].clone()
    expected[1, 3] = parts[0][1, 3] + parts[1][1, 3] + parts[2][0, 3]
    assert torch.allclose(patched[Site("block_out", 0)], expected, atol=1e-5)


def test_nnsight_leaves_no_instrumentation_on_the_shared_model(tiny_llama):
    from nnsight.intervention.source import STATE

    x = _ids(tiny_llama)
    rule_like = Request(inputs={"input_ids": x}, reads=(Site("block_out", 0),), logits=0)
    _run("nnsight-local", tiny_llama, rule_like)
    from analysis import sharpness as S

    with backends.using("nnsight-local"):
        S.tempered_logits(tiny_llama, x, S.Temperature.adaptive())  # uses .source on every attention module
    for module in tiny_llama.model.modules():
        assert "forward" not in module.__dict__ and STATE not in module.__dict__
    assert native._ACTIVE.get() is None


@pytest.mark.parametrize("name", BACKENDS)
def test_attention_rule_records_every_layer_and_softmax_equals_eager(name, tiny_llava):
    from analysis import sharpness as S

    x = _ids(tiny_llava)
    with tiny_llava.session():
        eager = tiny_llava.language_model(input_ids=x, output_attentions=True)
    rec = S.Recorder()
    with backends.using(name):
        logits = S.tempered_logits(tiny_llava, x, S.Temperature(), rec)
    assert torch.allclose(logits, eager.logits, atol=1e-6)
    for layer, att in enumerate(eager.attentions):
        assert torch.allclose(rec.probs[layer], att[:, :, -1, :], atol=1e-6)


def test_plan_orders_sites_by_execution_and_refuses_unwritable_sites(tiny_llama):
    request = Request(inputs={}, reads=(Site("final_norm"), Site("block_out", 1), Site("mlp_out", 0),
                                        Site("heads", 0), Site("block_in", 1), Site("attn_out", 0)))
    kinds = [(s.reads[0].kind, s.reads[0].layer) for s in plan(tiny_llama.model, request)]
    assert kinds == [("heads", 0), ("attn_out", 0), ("mlp_out", 0), ("block_in", 1), ("block_out", 1), ("final_norm", 0)]
    with pytest.raises(anatomy.AnatomyError, match="Cannot write"):
        plan(tiny_llama.model, Request(inputs={}, writes=(Write(Site("attn_weights", 0), torch.zeros(1)),)))
    with pytest.raises(ValueError, match="metric"):
        Request(inputs={}, grads=(Site("block_out", 0),))


def test_traced_body_refers_only_to_plain_values():
    """What nnsight ships to NDIF is the trace body and the names it reads: keep them few and plain."""
    import ast
    import builtins
    import inspect

    source = inspect.getsource(traced.trace)
    with_node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.With))
    body = ast.Module(body=with_node.body, type_ignores=[])
    read = {n.id for n in ast.walk(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in ast.walk(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    outside = read - bound - set(dir(builtins))
    assert outside == {"nnsight", "results", "program", "rule", "keep", "model", "metric", "shape", "tracer"}
