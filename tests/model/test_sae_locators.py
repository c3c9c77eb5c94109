"""SAE and data locators obey the deployment's allow-list, in analysis code (issue 39 item 4, issue 40 item 7):
with `[models] sources = ["zoo"]` no `sae-lens:` release reaches the Hub (whatever HF_HUB_OFFLINE says) and no
server folder is read; refusals name the locator as the visitor wrote it and nothing of the server (no
resolved path, no list of allowed folders, the same words whether a path exists or not). A run resolves its
SAE locator once (issue 43 item 4)."""
from __future__ import annotations

import json

import pytest

from analysis import sae_v
from analysis.sae_v import access

RELEASE = "sae-lens:gpt2-small-res-jb/blocks.1.hook_resid_pre"


def _config(tmp_path, monkeypatch, text: str) -> None:
    path = tmp_path / "instance.toml"
    path.write_text(text)
    monkeypatch.setenv("MODEL_INSPECTOR_CONFIG", str(path))


ZOO_ONLY = '[models]\nsources = ["zoo"]\ndefault = "zoo:shapes-lm"\n'


@pytest.fixture()
def no_hub(monkeypatch):
    """Every way sae-lens or huggingface_hub could reach the Hub, recorded instead."""
    import huggingface_hub
    import sae_lens

    calls = []

    def record(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the Hub was contacted")

    monkeypatch.setattr(sae_lens.SAE, "from_pretrained", record)
    for name in ("hf_hub_download", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, record)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the configuration alone must stop it
    sae_v.sources._outside_sae.cache_clear()
    yield calls
    sae_v.sources._outside_sae.cache_clear()


def test_a_zoo_only_instance_never_fetches_a_release(tiny_llama, tmp_path, monkeypatch, no_hub):
    _config(tmp_path, monkeypatch, ZOO_ONLY)
    for call in (lambda: sae_v.locate(tiny_llama, RELEASE), lambda: sae_v.load_outside(RELEASE),
                 lambda: sae_v.open_sae(tiny_llama, sae_v.SaeChoice(sae=RELEASE)),
                 lambda: sae_v.choose(tiny_llama, RELEASE, "dataset:noise", sae_v.RankParams)):
        with pytest.raises(access.RefusedLocator, match="does not fetch from the Hub") as refused:
            call()
        assert RELEASE in str(refused.value)
    assert no_hub == []


def test_a_hub_allow_list_refuses_other_repositories(tiny_llama, tmp_path, monkeypatch, no_hub):
    _config(tmp_path, monkeypatch, '[models]\nsources = ["zoo", "hub"]\nhub_models = ["someone/model"]\n'
                                   'default = "zoo:shapes-lm"\n')
    with pytest.raises(access.RefusedLocator, match="not among the Hub repositories"):
        sae_v.locate(tiny_llama, RELEASE)
    assert no_hub == []
    _config(tmp_path, monkeypatch, '[models]\nsources = ["zoo", "hub"]\ndefault = "zoo:shapes-lm"\n')
    assert sae_v.locate(tiny_llama, RELEASE).folder is None  # allowed: the fetch itself comes later


def test_a_zoo_only_instance_reads_no_server_folder(tiny_llama, model_root, tmp_path, monkeypatch):
    from sae_lens_factory import save_sae_lens

    sae = save_sae_lens(model_root / "locator-sae", "standard", "none", d_in=32)
    data = model_root / "locator-data"
    data.mkdir(exist_ok=True)
    (data / "texts.txt").write_text("w1 w2\n")
    assert sae_v.locate(tiny_llama, str(sae)).outside  # allowed locally (no configuration file)
    _config(tmp_path, monkeypatch, ZOO_ONLY)
    refusals = []
    for call in (lambda: sae_v.locate(tiny_llama, str(sae)), lambda: sae_v.userdata.load(str(data), "causal_lm"),
                 lambda: sae_v.choose(tiny_llama, str(sae)),
                 lambda: sae_v.userdata.image_from_ref(f"file:{data / 'texts.txt'}")):
        with pytest.raises(access.RefusedLocator, match="reads no server folders") as refused:
            call()
        refusals.append(str(refused.value))
    assert all("\n" not in r for r in refusals)


def test_a_refused_path_says_nothing_of_the_server(tiny_llama, model_root, tmp_path):
    """Outside the roots, an existing and a missing folder get the same words; relative paths are not
    resolved in the message; no allowed folder is named."""
    (tmp_path / "exists").mkdir()
    messages = {}
    for name in ("exists", "missing"):
        with pytest.raises(access.RefusedLocator) as refused:
            sae_v.locate(tiny_llama, str(tmp_path / name))
        messages[name] = str(refused.value).replace(str(tmp_path / name), "PATH")
    assert messages["exists"] == messages["missing"]
    for locator in ("../../../etc", "/etc/passwd", "~/.ssh"):
        for call in (lambda: sae_v.locate(tiny_llama, locator), lambda: sae_v.userdata.load(locator)):
            with pytest.raises(access.RefusedLocator) as refused:
                call()
            text = str(refused.value)
            assert f"'{locator}'" in text and str(model_root) not in text
            assert "/root" not in text and "/work" not in text and "/etc'" not in text.replace(f"'{locator}'", "")


def test_uploaded_data_needs_uploads_on(tmp_path, monkeypatch):
    _config(tmp_path, monkeypatch, ZOO_ONLY + '[uploads]\nenabled = false\n')
    with pytest.raises(access.RefusedLocator, match="Uploads are turned off"):
        sae_v.userdata.load("upload:" + "0" * 64)


def test_library_messages_lose_their_server_paths():
    assert access.without_paths("No such file: '/srv/data/models/x/cfg.json' (errno 2)") == \
        "No such file: '…' (errno 2)"
    assert access.without_paths("C:\\Users\\me\\sae\\cfg.json missing") == "… missing"
    assert access.without_paths("expected 128, got 64") == "expected 128, got 64"


def test_a_ranking_resolves_its_sae_locator_once(tiny_llama, model_root, monkeypatch, tmp_path):
    from sae_lens_factory import save_sae_lens

    from analysis.sae_v import sources

    sae = save_sae_lens(model_root / "once-sae", "standard", "none", d_in=32, seed=2)
    data = model_root / "once-data"
    data.mkdir(exist_ok=True)
    (data / "texts.jsonl").write_text("".join(json.dumps({"text": f"w{i} w{i + 1}"}) + "\n" for i in range(6)))
    monkeypatch.setattr(sae_v.types, "CACHE_ROOT", tmp_path)
    choice = sae_v.choose(tiny_llama, str(sae), str(data), sae_v.RankParams, store_pairs=6)
    scans = []
    real = sources.available_saes
    monkeypatch.setattr(sources, "available_saes", lambda handle: scans.append(1) or real(handle))
    sae_v.rank(tiny_llama, choice)
    assert len(scans) == 1  # one resolution per ranking (it was 7)
