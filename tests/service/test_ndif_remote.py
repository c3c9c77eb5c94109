"""Remote models through a local stand-in for NDIF (tests/service/fake_ndif.py, a server process of its
own): the same numbers as a local run, the API key only in the request's header, nothing sent but the
request, one-line errors for a missing or refused key, a model the server does not host and a server
that cannot be reached, and this process's code unchanged by a remote run."""
from __future__ import annotations

import json
import math
import pickle

import pytest
import torch

from analysis import backends
from analysis import sharpness as S
from analysis.backends import ndif
from analysis.framework.errors import ModelLoadError
from analysis.inversion import observed_states
from analysis.model_access.model_lock import activity
from analysis.model_access.models import ZOO_DIR, ModelSpec, load_model
from tests.service.fake_ndif import FakeNdif

KEY = "ndif-test-key-3f9c2a71"
REPO = "acme/shapes-lm"
SPEC = ModelSpec("ndif", REPO)


@pytest.fixture(autouse=True)
def one_thread():
    """The stand-in computes with one torch thread; so does this side while a test runs, whatever an earlier
    test left set, so 'the same numbers' can mean bit for bit (a matmul over 2 threads sums in another order:
    3.4427 vs 3.4428 in one hidden state)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def local():
    return load_model(ModelSpec.parse("zoo:shapes-lm"))


@pytest.fixture(scope="module")
def server():
    """The stand-in's process, which loads its own copy of the zoo model's weights."""
    with FakeNdif(KEY, {ndif.model_key(REPO, None, "causal_lm"): ZOO_DIR / "shapes-lm"}) as fake:
        yield fake


@pytest.fixture
def configured(server, tmp_path, monkeypatch):
    """A deployment whose [backend] runs REPO on the stand-in; the key in the environment."""
    cfg = tmp_path / "mi.toml"
    cfg.write_text(f'[backend]\nkind = "ndif"\nndif_host = "{server.host}"\nremote_models = ["{REPO}"]\n'
                   "poll_s = 0.01\n")
    monkeypatch.setenv("MODEL_INSPECTOR_CONFIG", str(cfg))
    monkeypatch.setenv("NDIF_API_KEY", KEY)
    monkeypatch.chdir(tmp_path)  # no .streamlit/secrets.toml here
    server.clear_log()
    return server


@pytest.fixture
def remote(configured):
    return ndif.load_remote(SPEC, folder=ZOO_DIR / "shapes-lm")


def test_remote_captures_equal_the_local_run(remote, local):
    ids = local.tokenizer("there is a red circle and a blue square")["input_ids"]
    assert backends.name_for(remote) == "ndif" and str(remote.model.device) == "meta"
    for layer in (0, 2, 4):
        assert torch.equal(observed_states(remote, ids, layer), observed_states(local, ids, layer))


def test_an_attention_rule_runs_remotely_with_the_same_statistics(remote, local):
    params = S.PromptParams(text="there is a red circle and a blue square . where is the red circle",
                            target="red circle", rule=S.Temperature.adaptive())
    there, here = S.analyse_prompt(remote, params), S.analyse_prompt(local, params)
    assert there.to_dict() == here.to_dict()
    assert KEY not in json.dumps(there.to_dict()) and KEY not in json.dumps(remote.spec.to_dict())


def test_residual_patching_runs_remotely_with_the_same_numbers(remote, local, configured):
    """Exact patching (the clean prompt in row 0, one cell copied per row) and attribution patching (gradients
    of the corrupted row's logit difference) on every component, run by the stand-in: the same shares."""
    from analysis import residual

    params = residual.ResidualParams(pair="needle-0", components=list(residual.COMPONENTS.names()),
                                     methods=["exact", "attribution"], batch=32)
    there, here = residual.patch(remote, params), residual.patch(local, params)
    assert there.to_dict() | {"seconds": {}, "model": ""} == here.to_dict() | {"seconds": {}, "model": ""}
    cells = sum(len(g.share) * len(g.share[0]) for g in there.grids if g.method == "exact")
    posts = [r for r in configured.log if r.method == "POST"]
    assert len(posts) == 1 + 1 + math.ceil((cells - 30) / 31)  # attribution: one job; exact: 30 cells, then 31 a job
    assert all(KEY.encode() not in r.body for r in posts)
    configured.clear_log()
    with pytest.raises(residual.ResidualError, match="weights stay on NDIF") as err:  # read here, after the forward
        residual.inspect(remote, params)
    assert "\n" not in str(err.value) and configured.log == []


def _class_attributes() -> dict:
    """Every attribute of every class defined in `analysis`, by (module, class, attribute)."""
    import sys

    found = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "analysis" or module is None:
            continue
        for cls in list(vars(module).values()):
            if isinstance(cls, type) and cls.__module__ == name:
                found.update({(name, cls.__qualname__, attr): value for attr, value in vars(cls).items()})
    return found


def test_a_remote_run_leaves_this_process_code_as_it_was(remote):
    """The rule's function and the classes it uses (Temperature, Result, the rules' registry) travel by
    value. Unpickled in the process that pickled them, cloudpickle rebuilt them into these very classes,
    with methods compiled from the shipped source (whose `gc_paused` lost its decorator): later results
    failed to load. A server is another process; nothing here may change."""
    from analysis.framework import results

    params = S.PromptParams(text="there is a red circle . where is the red circle", target="red circle",
                            rule=S.Temperature.fixed(0.5))
    before = _class_attributes()
    there = S.analyse_prompt(remote, params)
    after = _class_attributes()
    assert [key for key, value in before.items() if after.get(key) is not value] == []
    with results.gc_paused():
        pass
    assert type(there).from_json(there.to_json()).to_dict() == there.to_dict()
    assert S.Temperature.from_dict(params.rule.to_dict()) == params.rule


def test_the_key_travels_only_in_the_request_header_and_nothing_else_is_sent(remote, configured):
    ids = remote.tokenizer("a blue square")["input_ids"]
    observed_states(remote, ids, 2)
    log = configured.log
    paths = [(r.method, r.path.split("/")[1]) for r in log]
    assert paths[0] == ("POST", "request") and paths[-1] == ("GET", "result")
    assert set(paths[1:-1]) == {("GET", "response")}
    for r in log:
        assert KEY not in r.path
        expected = None if r.path.startswith("/result") else KEY
        assert r.headers.get("ndif-api-key") == expected
    post = log[0]
    assert set(post.fields) == {"data", "blob"}
    envelope = json.loads(post.fields["data"])
    assert envelope["model_key"] == ndif.model_key(REPO, None, "causal_lm")
    assert KEY.encode() not in post.body
    # The payload is the trace: its source and the few plain names it reads (no module of ours by value),
    # as the server read it.
    import zstandard

    raw = zstandard.ZstdDecompressor().decompress(post.fields["blob"])
    assert KEY.encode() not in raw and b"analysis.backends" not in raw.replace(b"analysis/backends", b"")
    shipped = post.payload
    assert set(shipped["locals"]) == {"results", "program", "rule", "keep", "model", "metric", "shape", "tracer",
                                      "nnsight"}
    assert shipped["globals"] == {}
    assert shipped["locals"]["rule"]["repr"] == "None" and shipped["locals"]["results"]["repr"] == "{}"
    assert "tracer.stop()" in shipped["source"]


def test_waiting_is_reported_to_the_page_and_a_stop_ends_it(remote):
    seen = []

    class Stop(Exception):
        pass

    def on_wait(status):
        seen.append(status.message())
        raise Stop

    ids = remote.tokenizer("a blue square")["input_ids"]
    with activity("test", on_wait), pytest.raises(Stop):
        observed_states(remote, ids, 1)
    assert seen and seen[0].startswith("Running on NDIF: running")


def test_missing_key_is_one_line_and_nothing_is_sent(remote, configured, monkeypatch):
    monkeypatch.delenv("NDIF_API_KEY")
    with pytest.raises(ndif.RemoteError, match="No NDIF API key on this server: set NDIF_API_KEY") as err:
        observed_states(remote, [1, 2, 3], 1)
    assert "\n" not in str(err.value)
    assert configured.log == []


def test_key_from_streamlit_secrets(configured, monkeypatch, tmp_path):
    monkeypatch.delenv("NDIF_API_KEY")
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text(f'[ndif]\napi_key = "{KEY}"\n')
    assert ndif.api_key() == KEY


def test_refused_key_is_one_line_without_the_key(remote, monkeypatch):
    monkeypatch.setenv("NDIF_API_KEY", "wrong-key-0000")
    with pytest.raises(ndif.RemoteError) as err:
        observed_states(remote, [1, 2, 3], 1)
    assert str(err.value) == "NDIF refused this server's API key (HTTP 401): check NDIF_API_KEY."


def test_a_model_the_server_does_not_host(configured, tmp_path, monkeypatch):
    cfg = tmp_path / "mi.toml"
    cfg.write_text(f'[backend]\nkind = "ndif"\nndif_host = "{configured.host}"\nremote_models = ["acme/other"]\n')
    handle = ndif.load_remote(ModelSpec("ndif", "acme/other"), folder=ZOO_DIR / "shapes-lm")
    with pytest.raises(ndif.RemoteError, match="NDIF does not host 'acme/other' right now") as err:
        observed_states(handle, [1, 2, 3], 1)
    assert "\n" not in str(err.value) and KEY not in str(err.value)


def test_an_unreachable_server(configured, tmp_path):
    cfg = tmp_path / "mi.toml"
    cfg.write_text(f'[backend]\nkind = "ndif"\nndif_host = "http://127.0.0.1:9"\nremote_models = ["{REPO}"]\n')
    handle = ndif.load_remote(SPEC, folder=ZOO_DIR / "shapes-lm")
    with pytest.raises(ndif.RemoteError, match=r"NDIF at http://127.0.0.1:9 cannot be reached \(ConnectError\)"):
        observed_states(handle, [1, 2, 3], 1)


def test_models_outside_the_allowed_list_are_refused_before_anything_is_read(configured):
    with pytest.raises(ModelLoadError, match="'acme/secret' is not among the models this instance runs on NDIF"):
        backends.load(ModelSpec.parse("ndif:acme/secret"))


def test_local_only_panels_say_so_for_a_remote_model(remote, local):
    assert backends.local_only(local, "KV-cache eviction") is None
    assert "stays local" in backends.local_only(remote, "KV-cache eviction")


def test_nothing_of_the_handle_pickles_the_key(remote):
    assert KEY.encode() not in pickle.dumps(remote.spec) and KEY not in repr(remote.remote)
