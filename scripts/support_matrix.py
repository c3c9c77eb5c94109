"""The support matrix: every panel on a tiny random-weight model of every Hugging Face family.

Each model is built offline from a config (`analysis.model_access.tiny_models.FAMILIES`), saved in
save_pretrained layout and loaded through `load_model` like a user's local folder. A cell "works"
when the panel's analysis runs and its invariant holds; otherwise it is the panel's own one-line
refusal. Anything else (a traceback) is a crash, which `tests/model/test_support_matrix.py` rejects.

    python scripts/support_matrix.py           # measure and rewrite the table in docs/models.md
    python scripts/support_matrix.py --check   # measure and exit 1 if docs/models.md differs
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)

README = ROOT / "docs" / "models.md"  # the file holding the table
BEGIN, END = "<!-- support-matrix:begin -->", "<!-- support-matrix:end -->"
PANELS = {"sharpness": "Attention sharpness", "kv": "KV-cache eviction", "inversion": "Prompt reconstruction",
          "sae": "SAE-V", "captions": "Caption correction", "residual": "Residual stream"}
PROMPT = "w3 w17 w42 w8"
CLAIMS = ["w1 w2", "w5 w6 w7"]


@dataclass(frozen=True)
class Cell:
    status: str  # "works" | "refused" | "crash"
    note: str = ""

    def text(self) -> str:
        return "works" if self.status == "works" else f"{self.status}: {self.note}"


# ---------------------------------------------------------------------------------------------
# One check per panel: run the analysis, assert its invariant


def check_sharpness(handle) -> None:
    """Our attention function at θ = 1 reproduces the model's own logits; every layer is recorded."""
    from analysis import sharpness as S

    prompt = S.build_prompt(handle.tokenizer, 4, seed=0)
    ids = torch.tensor([prompt.input_ids])
    recorder = S.Recorder()
    ours = S.tempered_logits(handle, ids, S.Temperature(), recorder)
    with handle.session():
        plain = handle.language_model(input_ids=ids, use_cache=False).logits.float()
    assert torch.allclose(ours, plain, atol=1e-5), f"logits differ by {float((ours - plain).abs().max()):.2e}"
    assert len(recorder.probs) == handle.info.layers, "not every layer was recorded"
    for probs in recorder.probs.values():
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-4)


def check_kv(handle) -> None:
    """The full-cache policy reproduces plain decoding; StreamingLLM keeps at most its budget."""
    from analysis import kv

    params = kv.KvParams(policy="streaming_llm", budget=8, context=24, pairs=2, prefill=0.5, policies=kv.policy_settings(sinks=2))
    task = kv.build_task(handle, params)
    full = kv.run_policy(handle, task.tokens, task.prefill_len, kv.make_policy(params, "full"))
    with handle.session():
        plain = handle.language_model(input_ids=torch.tensor([task.tokens])).logits[0].float()
    ref = plain[task.prefill_len - 1: len(task.tokens) - 1]
    assert torch.allclose(full.logits, ref, atol=1e-4), f"full cache differs by {float((full.logits - ref).abs().max()):.2e}"
    run = kv.run_policy(handle, task.tokens, task.prefill_len, kv.make_policy(params))
    layers = kv.evictable_layers(handle)
    assert max(lens[i] for lens in run.cache_len for i in layers) <= params.budget + 1


def check_inversion(handle) -> None:
    """The attack recovers the prompt exactly from layer-1 states."""
    from analysis import inversion as inv

    result = inv.reconstruct(handle, inv.AttackParams(prompt=PROMPT, layer=1))
    assert result.accuracy == 1.0, f"recovered {result.accuracy:.0%} of the tokens"


def check_sae(handle, folder: Path) -> None:
    """An SAE trains on the layer-0 residuals (text and image positions) and round-trips through disk."""
    from analysis import sae_v

    params = sae_v.BuildParams(layer=0, dataset="noise", train_pairs=6, eval_pairs=4, corrupted=0.5,
                               train=sae_v.TrainParams(d_sae=32, k=4, steps=30, batch_size=32))
    out = sae_v.build(handle, params, folder=folder)
    sae, meta = sae_v.load_sae(out)
    pairs = sae_v.make_pairs(handle, "noise", 2, seed=9)
    acts = sae_v.collect_activations(handle, pairs, 0)
    if handle.kind == "vlm":  # every patch of the base grid of every image is an image position
        found = int((acts.modality == sae_v.IMAGE).sum())
        per_image = handle.info.image_tokens or 1  # None: the count depends on the image's size (LLaVA-NeXT)
        assert found >= len(pairs.pairs) * per_image > 0, f"{found} image positions"
    x = sae_v.scaled(acts, meta.scales)
    codes = sae_v.encode(sae, x)
    again, recon = sae.reconstruct(x)  # load_sae gives the codec every SAE runs through (analysis/sae_v/codec.py)
    assert torch.allclose(codes, again, atol=1e-5) and recon.shape == x.shape
    assert int((codes > 0).sum(1).max()) <= params.train.k


def check_captions(handle) -> None:
    """Yes/no verification of each claim alone: batched equals one at a time; p_T + p_F <= 1; the VLM
    captions the image and Integrated Gradients grounds a claim on its patch grid."""
    from PIL import Image

    from analysis import captions as C
    from analysis.model_access.models import require_kind

    require_kind(handle, "vlm", panel="Caption correction")
    image = Image.new("RGB", (40, 40), (200, 30, 30))
    verifier = C.make_verifier("vlm-yesno", handle)
    batched = verifier.verify(image, CLAIMS)
    alone = [verifier.verify(image, [c])[0] for c in CLAIMS]
    for (t, f), (t1, f1) in zip(batched, alone):
        assert abs(t - t1) < 1e-4 and abs(f - f1) < 1e-4, "a claim's answer depends on the batch"
        assert 0.0 <= t + f <= 1.0 + 1e-6
    C.caption_image(handle, image, max_new_tokens=3)
    heatmap = C.ground_claims(verifier, image, CLAIMS[:1], steps=2)[0]
    assert len(heatmap) == len(heatmap[0]) == verifier.grid, "grounding heatmap is not the patch grid"


def check_residual(handle) -> None:
    """The logit lens at the last layer is the model's own logits; the direct logit attribution adds up to the
    logit difference; exact and attribution patching give a finite share for every cell of a pair."""
    import math

    from analysis import residual as R

    corrupt = PROMPT.replace("w17", "w18")
    answer, foil = (handle.tokenizer.decode([i]).strip() for i in (20, 21))  # two tokens of any vocabulary
    params = R.ResidualParams(pair="own", prompt=PROMPT, corrupt=corrupt, answer=answer, foil=foil, top_k=2,
                              components=["residual", "heads", "mlp"])
    seen = R.inspect(handle, params)
    assert seen.lens.last_gap <= 1e-5, f"the lens's last layer differs from the logits by {seen.lens.last_gap:.2e}"
    dla = seen.dla
    assert abs(dla.total - dla.model_value) <= 1e-3 * max(1.0, abs(dla.model_value)), "attribution does not add up"
    result = R.patch(handle, params)
    assert len(result.grids) == 6 and all(math.isfinite(v) for g in result.grids for row in g.share for v in row)


CHECKS = {"sharpness": check_sharpness, "kv": check_kv, "inversion": check_inversion, "sae": check_sae,
          "captions": check_captions, "residual": check_residual}


# ---------------------------------------------------------------------------------------------
# Measuring


def _refusal(exc: BaseException, folder: Path, family: str) -> str:
    text = " ".join(str(exc).split()).replace(f"local:{folder}", family).replace(str(folder), family)
    return text.replace("|", "/")


def measure_family(family: str, workdir: Path) -> dict[str, Cell]:
    from analysis.model_access.models import ModelLoadError, ModelSpec, load_model
    from analysis.framework.registry import SettingsError
    from analysis.model_access.tiny_models import save_tiny

    folder = save_tiny(family, workdir / family)
    from analysis.captions import CaptionError
    from analysis.inversion import InversionError
    from analysis.residual import ResidualError
    from analysis.sharpness import SharpnessError

    user_errors = (ModelLoadError, SettingsError, SharpnessError, InversionError, CaptionError, ResidualError)
    try:
        handle = load_model(ModelSpec("local", str(folder)))
    except user_errors as exc:
        return {p: Cell("refused", _refusal(exc, folder, family)) for p in PANELS}
    cells = {}
    for panel, check in CHECKS.items():
        torch.manual_seed(0)
        try:
            check(handle, workdir / f"{family}-sae") if panel == "sae" else check(handle)
            cells[panel] = Cell("works")
        except user_errors as exc:
            cells[panel] = Cell("refused", _refusal(exc, folder, family))
        except AssertionError as exc:
            cells[panel] = Cell("crash", f"invariant failed: {exc}")
        except Exception as exc:  # a traceback a user would see
            cells[panel] = Cell("crash", f"{type(exc).__name__}: {_refusal(exc, folder, family)}")
    return cells


def measure(families: list[str] | None = None) -> dict[str, dict[str, Cell]]:
    from analysis.model_access.tiny_models import FAMILIES

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        old = os.environ.get("MODEL_INSPECTOR_ROOTS")
        os.environ["MODEL_INSPECTOR_ROOTS"] = str(workdir)
        try:
            return {f: measure_family(f, workdir) for f in (families or list(FAMILIES))}
        finally:
            if old is None:
                os.environ.pop("MODEL_INSPECTOR_ROOTS", None)
            else:
                os.environ["MODEL_INSPECTOR_ROOTS"] = old


# ---------------------------------------------------------------------------------------------
# The table (docs/models.md)


def render(matrix: dict[str, dict[str, Cell]]) -> str:
    from analysis.model_access.tiny_models import FAMILIES

    head = "| family | kind | " + " | ".join(PANELS.values()) + " |"
    rule = "|---|---|" + "---|" * len(PANELS)
    rows = [f"| {f} | {FAMILIES[f][0].replace('causal_lm', 'causal LM').replace('vlm', 'VLM')} | "
            + " | ".join(cells[p].text() for p in PANELS) + " |" for f, cells in matrix.items()]
    return "\n".join([BEGIN, head, rule, *rows, END])


def readme_table(text: str | None = None) -> str | None:
    text = README.read_text() if text is None else text
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    return found.group(0) if found else None


def write_readme(table: str) -> None:
    text = README.read_text()
    old = readme_table(text)
    if old is None:
        raise SystemExit(f"docs/models.md has no {BEGIN} ... {END} markers.")
    README.write_text(text.replace(old, table))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the table in docs/models.md differs")
    args = parser.parse_args(argv)
    table = render(measure())
    if args.check:
        same = readme_table() == table
        print("The support matrix in docs/models.md is up to date." if same else table)
        return 0 if same else 1
    write_readme(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
