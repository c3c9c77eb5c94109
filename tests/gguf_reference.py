"""An independent reading of a GGUF file and a plain float64 Llama forward from it, for tests.

Written from the file format and the model's maths, not from the `gguf` package or transformers:
- container (GGUF v3): magic "GGUF", uint32 version, uint64 tensor count, uint64 key-value count;
  key-value pairs (uint64-length UTF-8 key, uint32 value type, value); tensor infos (name, uint32
  n_dims, uint64 dims with the fastest-varying first, uint32 ggml type, uint64 offset); the data
  section starts at the next multiple of `general.alignment` (32 when absent); little-endian.
- ggml block types used here: F32 (0); Q4_1 (3): 32 weights per 20-byte block, float16 scale d,
  float16 minimum m, then 16 bytes whose low nibbles are weights 0..15 and high nibbles weights
  16..31, w = q * d + m; Q8_0 (8): 32 weights per 34-byte block, float16 scale d, then 32 int8,
  w = q * d.
- forward: llama.cpp's LLaMA graph on the file's own tensor layout. The converter that wrote the
  file reorders the rows of Q and K inside each head so that RoPE rotates adjacent pairs
  (x[2i], x[2i+1]); this forward rotates adjacent pairs on the rows as stored, so it needs no
  un-permutation and checks the one transformers applies.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
F32, Q4_1, Q8_0 = 0, 3, 8
BLOCK = 32
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: slowest-varying first (rows, columns)
    kind: int
    offset: int  # from the start of the data section


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.buf = memoryview(Path(path).read_bytes())
        self.pos = 0
        if bytes(self.buf[:4]) != b"GGUF":
            raise ValueError("not a GGUF file")
        self.pos = 4
        self.version = self._scalar(4)
        n_tensors, n_kv = self._scalar(10), self._scalar(10)
        self.meta: dict = {}
        for _ in range(n_kv):
            key = self._string()
            self.meta[key] = self._value(self._scalar(4))
        self.tensors: dict[str, TensorInfo] = {}
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar(4)
            dims = [self._scalar(10) for _ in range(n_dims)]
            kind, offset = self._scalar(4), self._scalar(10)
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), kind, offset)
        align = int(self.meta.get("general.alignment", 32))
        self.data_start = -(-self.pos // align) * align

    def _scalar(self, kind: int):
        fmt = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._scalar(10)
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return text

    def _value(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            item, count = self._scalar(4), self._scalar(10)
            if item in _NUMPY:  # numbers: one read
                arr = np.frombuffer(self.buf, dtype=_NUMPY[item], count=count, offset=self.pos)
                self.pos += arr.nbytes
                return arr
            return [self._value(item) for _ in range(count)]
        return self._scalar(kind)

    def raw(self, name: str, rows: slice | None = None) -> tuple[np.ndarray, TensorInfo]:
        """The tensor's bytes (optionally only some rows: blocks never cross a row here)."""
        info = self.tensors[name]
        n_rows, n_cols = (1, info.shape[0]) if len(info.shape) == 1 else info.shape
        row_bytes = n_cols * 4 if info.kind == F32 else n_cols // BLOCK * BLOCK_BYTES[info.kind]
        start, stop = (0, n_rows) if rows is None else (rows.start, rows.stop)
        begin = self.data_start + info.offset + start * row_bytes
        data = np.frombuffer(self.buf, dtype=np.uint8, count=(stop - start) * row_bytes, offset=begin)
        return data.reshape(stop - start, row_bytes), info

    def tensor(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The tensor dequantised to float64, in numpy (rows, columns) order."""
        data, info = self.raw(name, rows)
        if info.kind == F32:
            out = data.reshape(-1).view("<f4").astype(np.float64)
            return out if len(info.shape) == 1 else out.reshape(data.shape[0], -1)
        if info.kind == Q4_1:
            out = dequantise_q4_1(data.reshape(-1))
        elif info.kind == Q8_0:
            out = dequantise_q8_0(data.reshape(-1))
        else:
            raise NotImplementedError(f"ggml type {info.kind} of {name}")
        return out.reshape(data.shape[0], -1)


def dequantise_q4_1(data: np.ndarray) -> np.ndarray:
    blocks = data.reshape(-1, 20)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float64)  # (n, 1)
    m = blocks[:, 2:4].copy().view("<f2").astype(np.float64)
    qs = blocks[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)  # weights 0..15, then 16..31
    return (q * d + m).reshape(-1)


def dequantise_q8_0(data: np.ndarray) -> np.ndarray:
    blocks = data.reshape(-1, 34)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float64)
    q = blocks[:, 2:34].copy().view(np.int8).astype(np.float64)
    return (q * d).reshape(-1)


def hf_rows_from_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Q/K rows in the Hugging Face order (per head: first halves of the rotated pairs, then second
    halves) from the file's order (per head: pairs adjacent)."""
    out_dim = w.shape[0]
    head = out_dim // n_heads
    return w.reshape(n_heads, head // 2, 2, -1).swapaxes(1, 2).reshape(out_dim, -1)


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def _rope_adjacent(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotate each adjacent pair (x[2i], x[2i+1]) of every head by position * base^(-2i/d)."""
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
    angle = positions[:, None, None] * theta  # (T, 1, d/2)
    cos, sin = np.cos(angle), np.sin(angle)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def llama_forward(f: GGUFFile, ids: list[int], layers: int | None = None) -> np.ndarray:
    """Logits (T, vocab) in float64 from the file's weights, for one sequence from position 0."""
    meta = f.meta
    arch = meta["general.architecture"]
    n_layers = int(meta[f"{arch}.block_count"]) if layers is None else layers
    n_heads, n_kv = int(meta[f"{arch}.attention.head_count"]), int(meta[f"{arch}.attention.head_count_kv"])
    eps = float(meta[f"{arch}.attention.layer_norm_rms_epsilon"])
    base = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    emb = f.tensor("token_embd.weight")
    x = emb[np.asarray(ids)]
    T, dim = x.shape
    head = dim // n_heads
    pos = np.arange(T, dtype=np.float64)
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    for i in range(n_layers):
        w = lambda name: f.tensor(f"blk.{i}.{name}.weight")  # noqa: E731
        h = _rms(x, w("attn_norm"), eps)
        q = _rope_adjacent((h @ w("attn_q").T).reshape(T, n_heads, head), pos, base)
        k = _rope_adjacent((h @ w("attn_k").T).reshape(T, n_kv, head), pos, base)
        v = (h @ w("attn_v").T).reshape(T, n_kv, head)
        group = n_heads // n_kv
        heads = []
        for hq in range(n_heads):
            kv = hq // group  # query heads share key-value heads in consecutive groups
            scores = q[:, hq] @ k[:, kv].T / np.sqrt(head) + causal
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            heads.append(p @ v[:, kv])
        x = x + np.concatenate(heads, axis=-1) @ w("attn_output").T
        h = _rms(x, w("ffn_norm"), eps)
        gate = h @ w("ffn_gate").T
        x = x + ((gate / (1.0 + np.exp(-gate))) * (h @ w("ffn_up").T)) @ w("ffn_down").T
    x = _rms(x, f.tensor("output_norm.weight"), eps)
    out = f.tensor("output.weight") if "output.weight" in f.tensors else emb  # tied embeddings
    return x @ out.T
