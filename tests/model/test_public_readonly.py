"""A read-only instance (the public example: `gallery.writable = false`) writes nothing other visitors
would then see (#39): the feature store of an SAE on a visitor's data is built and shown, but kept in
memory only; a writable instance still caches it on disk (tests/model/test_sae_data.py)."""
from __future__ import annotations

from analysis.framework import config as cfg
from analysis import sae_v
from test_sae_data import cache, outside_sae, pair_folder  # noqa: F401  (fixtures of the same SAE and data)


def test_a_read_only_instance_keeps_a_visitors_feature_store_in_memory(tiny_llava, outside_sae, pair_folder,  # noqa: F811
                                                                      cache, monkeypatch, tmp_path):  # noqa: F811
    config = tmp_path / "read-only.toml"  # local folders allowed, so that the SAE and data are found
    config.write_text('[models]\nsources = ["zoo", "local"]\n[gallery]\nwritable = false\n')
    monkeypatch.setenv(cfg.CONFIG_ENV, str(config))
    assert cfg.current().read_only()
    choice = sae_v.choose(tiny_llava, str(outside_sae), str(pair_folder), store_pairs=4, batch_pairs=2)
    store = sae_v.store_for(tiny_llava, choice)
    assert len(store.features) == 24 and len(store.pairs.pairs) == 4
    assert not sae_v.sources.store_folder(tiny_llava, choice).exists()
    assert not (cache / "stores").exists()


def test_a_read_only_instance_ranks_a_visitors_data_without_a_checkpoint_on_disk(tiny_llava, outside_sae,  # noqa: F811
                                                                                  pair_folder, cache,  # noqa: F811
                                                                                  monkeypatch, tmp_path):
    """The resumable ranking's checkpoint (one line per finished batch, under the cache folder) is not written
    either: it would outlive the visitor's upload, which expires, and grow the disk with every new upload."""
    config = tmp_path / "read-only.toml"
    config.write_text('[models]\nsources = ["zoo", "local"]\n[gallery]\nwritable = false\n')
    monkeypatch.setenv(cfg.CONFIG_ENV, str(config))
    params = sae_v.choose(tiny_llava, str(outside_sae), str(pair_folder), sae_v.RankParams, store_pairs=4,
                          batch_pairs=2, rules=sae_v.rule_settings(cooccur_threshold=0.0))
    ranking = sae_v.rank(tiny_llava, params)
    assert len(ranking.rows) == 7 and ranking.resumed == 0
    assert sae_v.filtering._checkpoint(tiny_llava, params) is None
    assert not (cache / "rankings").exists() and not (cache / "stores").exists()
