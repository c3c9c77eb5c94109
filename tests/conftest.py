"""Shared fixtures: tiny random-weight models (real HF classes) saved under a temp root."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Page tests check what a view shows, not this machine's speed: no run waits for a click
# (tests/page/test_cost.py switches the cost gate back on where it is the subject).
os.environ.setdefault("MODEL_INSPECTOR_ASK_ABOVE_S", "inf")

import pytest  # noqa: E402

pytest.register_assert_rewrite("page_checks")  # tests/browser/page_checks.py: its asserts explain themselves

ROOT = Path(__file__).resolve().parent.parent  # the one bootstrap: put the checkout on the path
sys.path.insert(0, str(ROOT))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

# Tests live in one folder per tier; the folder is the marker (`pytest -m unit`, registered in pytest.ini):
# unit: pure logic and tiny models, the inner loop (the whole tier under a minute); model: analyses on the
# demo zoo and the real model; page: AppTest of the app's pages; service: servers, databases, subprocesses;
# browser: Chromium against a running server.
TIERS = ("unit", "model", "page", "service", "browser")


# In parallel (scripts/test.sh: `pytest -n 2 --dist loadfile`, pytest-xdist) a test file is one unit of work, run
# whole on one worker, so its module and session fixtures (servers, browsers, models) are built once. The
# heaviest tiers are handed out first, so the many small unit files even out the end (a serial run keeps the
# folders' order). The workers collect, and their order is the one handed out: xdist gives them dist "no".
DISPATCH = ("browser", "service", "model", "page", "unit")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    parallel = os.environ.get("PYTEST_XDIST_WORKER") is not None or getattr(config.option, "dist", "no") != "no"
    for item in items:
        tier = Path(str(item.path)).parent.name
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test file belongs in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
    if parallel:
        items.sort(key=lambda item: DISPATCH.index(Path(str(item.path)).parent.name))


# What a run costs, printed at its end (scripts/test.sh, every run): each tier's summed test time (setup,
# call and teardown; in a parallel run the workers' times add up) beside the run's wall time, and how many
# app servers and Chromiums the tests started. A worker process counts its own starts (an audit hook sees
# every subprocess: a server is one given `--server.port`, a Chromium one Playwright driver, which
# launches one browser in this suite) and passes them on with each test's report.
STARTS = {"servers": 0, "browsers": 0}
_PASSED_ON = dict(STARTS)


def _count_starts(event, args):
    if event != "subprocess.Popen":
        return
    argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
    argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]
    if "--server.port" in argv:
        STARTS["servers"] += 1
    elif "run-driver" in argv:  # playwright's node driver, one per sync_playwright()
        STARTS["browsers"] += 1


sys.addaudithook(_count_starts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    for kind, count in STARTS.items():
        if count > _PASSED_ON[kind]:
            report.user_properties.append((f"started_{kind}", count - _PASSED_ON[kind]))
            _PASSED_ON[kind] = count


def pytest_sessionstart(session):
    session.config._mi_started = time.perf_counter()


def pytest_terminal_summary(terminalreporter, config):
    seconds, tests, started = dict.fromkeys(TIERS, 0.0), dict.fromkeys(TIERS, 0), {k: 0 for k in STARTS}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue
            tier = Path(report.nodeid.split("::")[0]).parent.name
            if tier not in seconds:
                continue
            seconds[tier] += report.duration
            tests[tier] += report.when == "call" or (report.when == "setup" and report.outcome != "passed")
            for name, value in report.user_properties:
                if name.startswith("started_"):
                    started[name.removeprefix("started_")] += value
    if not any(tests.values()):  # --collect-only, or nothing selected
        return
    wall = time.perf_counter() - getattr(config, "_mi_started", time.perf_counter())
    terminalreporter.write_sep("=", "time per tier (summed test durations)")
    for tier in TIERS:
        if tests[tier]:
            terminalreporter.write_line(f"{tier:>8}: {seconds[tier]:8.1f} s in {tests[tier]} tests")
    terminalreporter.write_line(f"{'all':>8}: {sum(seconds.values()):8.1f} s in {sum(tests.values())} tests; "
                                f"wall time {wall:.1f} s; started {started['servers']} app servers and "
                                f"{started['browsers']} Chromiums")

from analysis.model_access import tiny_models  # noqa: E402
from analysis.model_access.models import ZOO_DIR, ModelSpec, load_model  # noqa: E402
from analysis.world.tokenizer import make_word_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    os.environ["MODEL_INSPECTOR_ROOTS"] = os.pathsep.join([str(root), str(ZOO_DIR)])
    return root


@pytest.fixture(scope="session")
def tiny_llama_dir(model_root) -> Path:
    return tiny_models.save_tiny_llama(model_root / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_gpt2_dir(model_root) -> Path:
    return tiny_models.save_tiny_gpt2(model_root / "tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_llava_dir(model_root) -> Path:
    return tiny_models.save_tiny_llava(model_root / "tiny-llava")


@pytest.fixture(scope="session")
def tiny_mistral_sliding_dir(model_root) -> Path:
    """A Mistral whose every layer is sliding-window: its cache must never be evicted."""
    from transformers import MistralConfig, MistralForCausalLM

    folder = model_root / "tiny-mistral-sliding"
    tok = make_word_tokenizer(tiny_models.default_words())
    cfg = MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
                        max_position_embeddings=128)
    MistralForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir):
    return load_model(ModelSpec("local", str(tiny_llama_dir)))


@pytest.fixture(scope="session")
def tiny_gpt2(tiny_gpt2_dir):
    return load_model(ModelSpec("local", str(tiny_gpt2_dir)))


@pytest.fixture(scope="session")
def tiny_llava(tiny_llava_dir):
    return load_model(ModelSpec("local", str(tiny_llava_dir)))


def as_the_app_names(handle):
    """`handle` under the name the app gives its model (components.model_picker.short_local): a local folder
    under an allowed root is `local:tiny-llava`, not its full path. What the app keys by that name (the SAEs
    sae_v.available_saes finds for a model) must be built under it to be found on the page."""
    import dataclasses

    from components.model_picker import short_local

    return dataclasses.replace(handle, spec=short_local(handle.spec))


def app_with_model(spec: ModelSpec | None, page: str | None = None, query: dict | None = None,
                   timeout: float = 60):
    """An AppTest of the whole app with `spec` as the session's model, switched to `page`.

    `page` is a file under views/ (e.g. "views/kv_cache.py"); `query` pre-fills st.query_params.
    """
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    if spec is not None:
        at.session_state["model_spec"] = spec
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    if page is not None:
        at.switch_page(page)
        at.run()
    return at


def table_with(at, column: str):
    """The first table an AppTest page shows that has `column` (AppTest does not expose dataframe keys)."""
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with column {column!r}")


def metric_starting(at, label_start: str):
    """The first metric card whose label starts with `label_start`."""
    for m in at.metric:
        if m.label.startswith(label_start):
            return m
    raise AssertionError(f"no metric {label_start!r}: {[m.label for m in at.metric]}")


def zoo_model_ready(model: str) -> bool:
    """A demo-zoo model (`zoo:shapes-lm`), or a real zoo model already converted here (a test never
    converts one: hundreds of MB and minutes)."""
    from analysis.model_access.models import zoo_models

    name = model.removeprefix("zoo:")
    if name in zoo_models():
        return True
    try:
        from analysis.model_access import real_models
    except ImportError:
        return False
    return name in real_models.REAL_MODELS and real_models.is_built(name)


@pytest.fixture()
def computations(monkeypatch):
    """Counts the analyses that actually start (cached_run's computation step)."""
    from components import runs

    started = []
    real = runs._compute

    def counting(key, *args, **kwargs):
        started.append(key.kind)
        return real(key, *args, **kwargs)

    monkeypatch.setattr(runs, "_compute", counting)
    runs.run_store().clear()
    yield started
    runs.run_store().clear()


# One Chromium and one app server per test process, shared by the browser tests (each started on first
# use: a worker that draws no page starts neither). A test takes a browser context of its own (its own
# cookies: a fresh Streamlit session), so tests share processes, never state.
class SharedChromium:
    """Debian's headless Chromium under one Playwright, started on first use. Playwright's sync API allows
    one Playwright per thread, so it is stopped before a browser test that does not ask for it (one that
    starts its own) and started again for the next that does."""

    def __init__(self):
        self._playwright = self._browser = None

    @property
    def browser(self):
        if self._browser is None or not self._browser.is_connected():
            from playwright.sync_api import sync_playwright

            sys.path.insert(0, str(ROOT / "scripts"))
            import screenshot

            self.stop()
            self._playwright = sync_playwright().start()
            self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=screenshot.CHROMIUM_ARGS)
        return self._browser

    def new_context(self, **options):
        return self.browser.new_context(**options)

    def stop(self) -> None:
        playwright, self._playwright, self._browser = self._playwright, None, None
        if playwright is not None:
            playwright.stop()  # closes the browser with it


_CHROMIUM = SharedChromium()


@pytest.fixture(scope="session")
def chromium():
    """The process's Chromium (skips where Debian's chromium is not installed)."""
    import shutil

    if not shutil.which(CHROMIUM):
        pytest.skip("Debian chromium is not installed")
    yield _CHROMIUM
    _CHROMIUM.stop()


def pytest_runtest_setup(item):
    if "chromium" not in item.fixturenames:
        _CHROMIUM.stop()


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    """The process's app server, as deployed (scripts/serve.py), on the demo zoo, with its own store and the
    cost gate off (no run waits for a click, whatever this machine's speed); stopped at the end. Started on
    first use. Its run cache is shared: a test that needs a live computation asks for settings no other
    test uses."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import crowd_bench

    store = tmp_path_factory.mktemp("app-server") / "analyses.db"
    proc, base, _ = crowd_bench.start_server({"MODEL_INSPECTOR_STORE": str(store),
                                              "MODEL_INSPECTOR_ROOTS": str(ZOO_DIR),
                                              "MODEL_INSPECTOR_ASK_ABOVE_S": "inf"})
    yield SimpleNamespace(base=base, store=store, proc=proc)
    crowd_bench.stop_server(proc)
