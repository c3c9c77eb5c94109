"""Running the first L layers: the victim's states, candidates' states, gradient inversion, and the prompt.

Everything here runs inside `handle.patch()`: the capture hook stops each forward after block L (or
captures the embeddings for L = 0), and is removed when the patch ends.
"""
from __future__ import annotations

import torch

from analysis.model_access import anatomy
from analysis import backends
from analysis.inversion.orders import Vocabulary
from analysis.inversion.params import MAX_TOKENS, InversionError
from analysis.model_access.models import ModelHandle

MAX_START_CONTEXTS = 32  # special tokens whose next-token distributions make the start-of-text prior


class Probe:
    """Captures the residual stream after block L (or the embeddings for L = 0) and stops there."""

    def __init__(self, handle: ModelHandle, patch, layer: int) -> None:
        self.lm = handle.language_model
        self.layer = layer
        # depth L: the input of block 0 for L = 0 (the embeddings), else the output of block L - 1
        self.capture = anatomy.Capture(max(layer - 1, 0), before=layer == 0).attach(patch, self.lm)

    @property
    def captured(self) -> torch.Tensor | None:
        return self.capture.output

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.lm.config)

    def run(self, ids: torch.Tensor, start: int, cache=None, full: bool = False):
        """Layer-L states (B, T, d) of `ids` placed at positions start.., and last logits if `full`."""
        batch, length = ids.shape
        positions = torch.arange(start, start + length, device=ids.device).expand(batch, length)
        self.capture.stop = not full
        logits = None
        try:
            out = self.lm(input_ids=ids, position_ids=positions, cache=cache,
                          use_cache=cache is not None, logits_to_keep=1)
            logits = out.logits[:, -1].float()
        except anatomy.StopForward:
            pass
        finally:
            self.capture.stop = True
        return self.captured.float(), logits

    def expanded(self, cache, batch: int):
        """A cache holding the prefix once, viewed `batch` times (no copy) for a candidate batch."""
        if cache is None or cache.get_seq_length() == 0:
            return None
        out = self.new_cache()
        for src, dst in zip(cache.layers[: self.layer], out.layers[: self.layer]):
            if src.keys is None or not src.is_initialized:
                continue
            dst.lazy_initialization(src.keys, src.values)
            dst.keys = src.keys.expand(batch, *src.keys.shape[1:])
            dst.values = src.values.expand(batch, *src.values.shape[1:])
        return out

    def invert(self, cache, position: int, rows: torch.Tensor, sorted_dims: bool, steps: int,
               vocabulary: Vocabulary) -> torch.Tensor:
        """An input embedding whose layer-L state at `position` is L1-close to one of `rows`,
        found by Adam from the mean embedding (no weights change; gradients flow only to it)."""
        table = anatomy.input_embeddings(self.lm).weight
        start, scale = vocabulary.stats()
        embed = start.to(table).clone().requires_grad_(True)
        opt = torch.optim.Adam([embed], lr=0.15 * scale)
        rows = rows.to(table.device)
        positions = torch.tensor([[position]], device=table.device)
        with torch.enable_grad():
            for _ in range(steps):
                try:
                    self.lm(inputs_embeds=embed[None, None], position_ids=positions,
                            cache=self.expanded(cache, 1), use_cache=cache is not None)
                except anatomy.StopForward:
                    pass
                state = self.captured[0, -1].float()
                if sorted_dims:
                    state = state.sort().values
                loss = (state[None] - rows).abs().sum(dim=1).min()
                (grad,) = torch.autograd.grad(loss, embed)
                embed.grad = grad
                opt.step()
        return embed.detach().float().cpu()

    def candidates(self, cache, position: int, ids: torch.Tensor) -> torch.Tensor:
        """Layer-L state of each candidate token (B,) at `position` after the cached prefix."""
        states, _ = self.run(ids[:, None], position, self.expanded(cache, len(ids)))
        return states[:, -1]

    def start_prior(self, handle: ModelHandle) -> torch.Tensor | None:
        """Logits of the model's prior for the first token of a text: its next-token distribution after
        each of the tokenizer's special tokens (a text usually starts after one), averaged as
        probabilities. None when the tokenizer has no special tokens."""
        special = sorted(set(getattr(handle.tokenizer, "all_special_ids", []) or []))[:MAX_START_CONTEXTS]
        special = [i for i in special if 0 <= i < vocab_size(handle)]
        if not special:
            return None
        _, logits = self.run(torch.tensor(special, device=handle.device)[:, None], 0, full=True)
        return torch.logsumexp(torch.log_softmax(logits, dim=-1), dim=0).cpu()


def observed_states(handle: ModelHandle, ids: list[int], layer: int) -> torch.Tensor:
    """The victim's layer-L hidden states (N, d) of a token sequence (one forward, first L layers)."""
    check_layer(handle, layer)
    # depth L: the input of block 0 for L = 0 (the embeddings), else the output of block L - 1
    site = backends.Site("block_in", 0) if layer == 0 else backends.Site("block_out", layer - 1)
    request = backends.Request(inputs={"input_ids": torch.tensor([ids]), "position_ids": torch.arange(len(ids))[None],
                                       "use_cache": False},
                               reads=(site,), root="language_model")
    return backends.run(handle, request)[site][0].float()


def check_layer(handle: ModelHandle, layer: int) -> None:
    n = handle.info.layers
    if not 0 <= int(layer) <= n:
        raise InversionError(f"Layer {layer} is out of range: this model has layers 0 (embeddings) to {n}.")


def tokenize(handle: ModelHandle, prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    if not prompt or not prompt.strip():
        raise InversionError("The prompt is empty: type a few words to reconstruct.")
    ids = handle.tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if len(ids) > max_tokens:
        raise InversionError(
            f"The prompt has {len(ids)} tokens; the limit here is {max_tokens}. Shorten it "
            "(the attack costs one vocabulary search per token)."
        )
    if not ids:
        raise InversionError("The prompt produced no tokens.")
    return ids


def vocab_size(handle: ModelHandle) -> int:
    return int(anatomy.input_embeddings(handle.language_model).weight.shape[0])


def token_text(handle: ModelHandle, token_id: int) -> str:
    text = handle.tokenizer.decode([int(token_id)])
    return text if text.strip() else repr(text)
