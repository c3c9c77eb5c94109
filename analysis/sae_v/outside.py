"""SAEs from elsewhere: any SAE sae-lens can load from a folder (`cfg.json` + `sae_weights.safetensors`),
or a sae-lens release / SAE id through its pretrained loader when the machine is online and the deployment
lets this instance fetch from the Hub (analysis/sae_v/access.py: checked before sae-lens is called).

Before it is used, an outside SAE is checked against the loaded model, with one clear message when it
does not fit: its hook must be the residual stream after (or before) a decoder layer of this model, and
its input width (`d_in`) must be that layer's width. It reads the raw residual (no per-modality scale).
"""
from __future__ import annotations

import re
from pathlib import Path

from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle
from analysis.sae_v.access import RELEASE_PREFIX, check_release, shown, without_paths
from analysis.sae_v.codec import Codec, SaeFitError, as_codec, fold_saved_scaler

# hook name -> (pattern, offset): the decoder layer whose *output* the hook reads is the number + offset
HOOKS = (
    (re.compile(r"^blocks\.(\d+)\.hook_resid_post$"), 0),  # TransformerLens: after block L
    (re.compile(r"^blocks\.(\d+)\.hook_resid_pre$"), -1),  # before block L = after block L - 1
    (re.compile(r"^(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)(?:\.output)?$"), 0),  # an HF module
)


def hook_layer(hook_name: str | None) -> int | None:
    """The decoder layer whose output a hook reads (None: no hook name; -1: the embeddings); raises
    SaeFitError for a hook that is not the residual stream of a decoder layer."""
    if not hook_name:
        return None
    for pattern, offset in HOOKS:
        found = pattern.match(hook_name.strip())
        if found:
            return int(found.group(1)) + offset
    raise SaeFitError(f"This SAE reads '{hook_name}', which is not the residual stream of a decoder layer "
                      "(blocks.L.hook_resid_post, blocks.L.hook_resid_pre or model.layers.L): the SAE-V panel reads "
                      "only those.")


def load_outside(locator: str) -> Codec:
    """The sae-lens SAE a folder or `sae-lens:RELEASE/SAE_ID` names, as a Codec (architecture and
    normalisation checked: SaeFitError, one line, for what SAE-V does not run)."""
    from sae_lens import SAE

    if locator.startswith(RELEASE_PREFIX):
        release, sae_id = check_release(locator)  # the deployment's allow-list first: nothing is fetched before
        check_release_id(release, sae_id)  # an id the release does not have: said so, nothing fetched
        try:
            sae = SAE.from_pretrained(release, sae_id).eval()
        except Exception as exc:  # offline, a failed download, an unknown release: one line for the user
            why = _first_line(exc, keep=(release, sae_id))
            offline = _is_offline(exc)
            raise SaeFitError(f"sae-lens could not fetch {shown(locator)}: {why}"
                              + (" (pretrained SAEs need the machine to be online, or the files in the Hugging "
                                 "Face cache)." if offline else "")) from None
        return as_codec(sae)
    folder = Path(locator)
    if not (folder / "cfg.json").is_file() or not list(folder.glob("*.safetensors")):
        raise SaeFitError("No sae-lens SAE there (cfg.json and sae_weights.safetensors expected).")
    try:
        sae = SAE.load_from_disk(folder).eval()
    except Exception as exc:  # a cfg.json sae-lens does not understand: one line for the user
        raise SaeFitError(f"sae-lens could not load this SAE: {_first_line(exc)}") from None
    scale = fold_saved_scaler(sae, folder)
    codec = as_codec(sae)
    codec.code_scale = scale
    return codec


OFFLINE_WORDS = re.compile(r"connect|offline|internet|network|name resolution", re.IGNORECASE)


def check_release_id(release: str, sae_id: str) -> None:
    """SaeFitError when sae-lens's own list (read locally) has this release and it has no such SAE id; the
    message names at most three ids close to the one asked for, not the release's first few."""
    import difflib

    try:
        from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

        directory = get_pretrained_saes_directory()
    except Exception:  # pragma: no cover - an sae-lens without its list: sae-lens itself decides
        return
    entry = directory.get(release)
    if entry is None or sae_id in entry.saes_map:
        return  # not on the list (sae-lens may read it as a Hub repository), or a known id
    close = difflib.get_close_matches(sae_id, list(entry.saes_map), n=3, cutoff=0.6)
    hint = f"; the closest: {', '.join(repr(c) for c in close)}" if close else ""
    raise SaeFitError(f"sae-lens's release '{shown(release)}' has no SAE '{shown(sae_id)}' ({len(entry.saes_map)} "
                      f"SAEs{hint}).")


def _is_offline(exc: BaseException) -> bool:
    """Whether fetching failed for want of a connection (or in offline mode), not because of what was asked."""
    seen, cur = 0, exc
    while cur is not None and seen < 8:
        names = {k.__name__ for k in type(cur).__mro__}  # requests', httpx's and huggingface_hub's, by name
        if isinstance(cur, (ConnectionError, TimeoutError)) or names & {
                "ConnectionError", "Timeout", "ConnectError", "ConnectTimeout", "OfflineModeIsEnabled",
                "LocalEntryNotFoundError"}:
            return True
        if isinstance(cur, OSError) and OFFLINE_WORDS.search(str(cur)):  # transformers' "couldn't connect" OSError
            return True
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return False


def _first_line(exc: BaseException, keep: tuple[str, ...] = ()) -> str:
    """The first line of a library's error, server paths cut; the strings of `keep` (a release and an SAE id,
    which contain '/') stay whole."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    marks = {f"\x00{i}\x00": k for i, k in enumerate(k for k in keep if k)}
    for mark, value in marks.items():
        line = line.replace(value, mark)
    line = without_paths(line)
    for mark, value in marks.items():
        line = line.replace(mark, value)
    return line[:300]


def check_fit(handle: ModelHandle, sae, layer: int = -1) -> tuple[int, str]:
    """(layer, hook name) this SAE reads on this model; SaeFitError (one line) when it does not fit.

    `layer` (>= 0) is the user's choice for an SAE whose cfg.json names no hook; with a hook it must agree."""
    cfg = sae.cfg
    hook = getattr(cfg.metadata, "hook_name", None) or ""
    from_hook = hook_layer(hook)
    if from_hook == -1:
        raise SaeFitError(f"This SAE reads '{hook}', the token embeddings before any decoder layer; the SAE-V panel "
                          "reads a decoder layer's output.")
    if from_hook is None and layer < 0:
        raise SaeFitError("This SAE's cfg.json names no hook, so the layer it reads is unknown: choose the layer "
                          "(--layer on the command line).")
    if from_hook is not None and layer >= 0 and layer != from_hook:
        raise SaeFitError(f"This SAE reads layer {from_hook} (hook '{hook}'), not layer {layer}.")
    chosen = from_hook if from_hook is not None else layer
    n = anatomy.n_layers(handle.model)
    if not 0 <= chosen < n:
        raise SaeFitError(f"This SAE reads layer {chosen}{f' (hook {hook!r})' if hook else ''}, but "
                          f"{handle.spec.label} has layers 0 to {n - 1}: it was made for another model.")
    width = int(handle.info.hidden_size)
    if int(cfg.d_in) != width:
        raise SaeFitError(f"This SAE reads {cfg.d_in}-wide vectors (cfg.json d_in), but layer {chosen} of "
                          f"{handle.spec.label} is {width}-wide: it was made for another model.")
    return chosen, hook or f"blocks.{chosen}.hook_resid_post"


def source_label(locator: str) -> str:
    return "sae-lens release" if locator.startswith(RELEASE_PREFIX) else "sae-lens folder"
