"""A word-level tokenizer: one token per whitespace-separated word, specials first.

Shapes World's prompts are words of one vocabulary, so a token position is a word position; the zoo's
models are trained with it (analysis/zoo/train/) and the tests' tiny models use it (analysis/model_access/tiny_models.py).
"""
from __future__ import annotations

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]


def make_word_tokenizer(words: list[str], extra_special: list[str] = ()):
    """A whitespace word-level `PreTrainedTokenizerFast` (ids: specials first, then `words`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for w in [*SPECIALS, *extra_special, *words]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        additional_special_tokens=list(extra_special) or None,
    )
    return fast
