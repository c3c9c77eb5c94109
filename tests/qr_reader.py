"""A small QR code reader for tests: PNG bytes -> the text the code holds, written from ISO/IEC 18004 (model 2),
independent of the encoder (segno) whose output it reads.

    read_qr(png_bytes)   # "http://host/?talk=kv-cache"

It reads a clean, computer-drawn code (every module a square of one colour, a light quiet zone), versions 1-10:
finds the grid from the top-left finder pattern, reads the format information (the nearest of the 32 valid
15-bit words: error level and mask), removes the mask from every module outside the function patterns, reads
the codewords in the standard zigzag, undoes the block interleaving and parses numeric, alphanumeric and byte
segments. It corrects no errors (a drawn code has none); a wrong format or length is an AssertionError.
"""
from __future__ import annotations

import io

ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ $%*+-./:"
LEVEL_OF_FORMAT = {1: "L", 0: "M", 3: "Q", 2: "H"}  # the two format bits of each error-correction level
# per version 1-10 (index 0 unused), from the standard's table 9: error-correction codewords per block, blocks
ECC_PER_BLOCK = {"L": [0, 7, 10, 15, 20, 26, 18, 20, 24, 30, 18], "M": [0, 10, 16, 26, 18, 24, 16, 18, 22, 22, 26],
                 "Q": [0, 13, 22, 18, 26, 18, 24, 18, 22, 20, 24], "H": [0, 17, 28, 22, 16, 22, 28, 26, 26, 24, 28]}
BLOCKS = {"L": [0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4], "M": [0, 1, 1, 1, 2, 2, 4, 4, 4, 5, 5],
          "Q": [0, 1, 1, 2, 2, 4, 4, 6, 6, 8, 8], "H": [0, 1, 1, 2, 4, 4, 4, 5, 6, 8, 8]}
MASKS = [lambda r, c: (r + c) % 2 == 0, lambda r, c: r % 2 == 0, lambda r, c: c % 3 == 0,
         lambda r, c: (r + c) % 3 == 0, lambda r, c: (r // 2 + c // 3) % 2 == 0,
         lambda r, c: (r * c) % 2 + (r * c) % 3 == 0, lambda r, c: ((r * c) % 2 + (r * c) % 3) % 2 == 0,
         lambda r, c: ((r + c) % 2 + (r * c) % 3) % 2 == 0]


def modules(png: bytes) -> list[list[bool]]:
    """The code's modules (True: dark), sampled at each module's centre."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("L")
    width, height = image.size
    dark = [[image.getpixel((x, y)) < 128 for x in range(width)] for y in range(height)]
    top = next(y for y in range(height) if any(dark[y]))
    left = min(row.index(True) for row in dark if True in row)
    right = max(width - 1 - row[::-1].index(True) for row in dark if True in row)
    run = 0
    while dark[top][left + run]:  # the finder pattern's top edge: 7 dark modules
        run += 1
    scale = run / 7
    size = round((right - left + 1) / scale)
    assert (size - 17) % 4 == 0, f"{size} modules across is no QR version"
    return [[dark[top + int((r + 0.5) * scale)][left + int((c + 0.5) * scale)] for c in range(size)]
            for r in range(size)]


def _format_word(level_bits: int, mask: int) -> int:
    data = level_bits << 3 | mask
    rem = data
    for _ in range(10):
        rem = (rem << 1) ^ ((rem >> 9) * 0x537)
    return ((data << 10) | (rem & 0x3FF)) ^ 0x5412


def format_info(grid: list[list[bool]]) -> tuple[str, int]:
    """(error level, mask) from the copy of the format information around the top-left finder."""
    cells = [(i, 8) for i in range(6)] + [(7, 8), (8, 8), (8, 7)] + [(8, 14 - i) for i in range(9, 15)]
    word = sum(grid[r][c] << i for i, (r, c) in enumerate(cells))
    best = min(((bin(word ^ _format_word(lv, m)).count("1"), lv, m) for lv in range(4) for m in range(8)))
    assert best[0] <= 3, f"no valid format information ({word:015b})"
    return LEVEL_OF_FORMAT[best[1]], best[2]


def alignment_centres(version: int, size: int) -> list[int]:
    if version == 1:
        return []
    count = version // 7 + 2
    step = (version * 8 + count * 3 + 5) // (count * 4 - 4) * 2
    return sorted([6] + [size - 7 - i * step for i in range(count - 1)])


def function_modules(version: int, size: int) -> list[list[bool]]:
    """Finders with their separators and format areas, timing lines, alignment patterns, version areas."""
    used = [[False] * size for _ in range(size)]

    def mark(r0, c0, rows, cols):
        for r in range(max(r0, 0), min(r0 + rows, size)):
            for c in range(max(c0, 0), min(c0 + cols, size)):
                used[r][c] = True

    mark(0, 0, 9, 9)
    mark(0, size - 8, 9, 8)
    mark(size - 8, 0, 8, 9)
    mark(6, 0, 1, size)
    mark(0, 6, size, 1)
    centres = alignment_centres(version, size)
    for r in centres:
        for c in centres:
            if (r, c) not in ((6, 6), (6, size - 7), (size - 7, 6)):
                mark(r - 2, c - 2, 5, 5)
    if version >= 7:
        mark(0, size - 11, 6, 3)
        mark(size - 11, 0, 3, 6)
    return used


def codewords(grid: list[list[bool]], version: int, mask: int) -> list[int]:
    """Every codeword in placement order (data and error correction, interleaved), mask removed."""
    size = len(grid)
    used = function_modules(version, size)
    bits = []
    right = size - 1
    while right >= 1:
        if right == 6:
            right = 5  # the vertical timing line
        upward = ((right + 1) & 2) == 0
        for vert in range(size):
            r = size - 1 - vert if upward else vert
            for c in (right, right - 1):
                if not used[r][c]:
                    bits.append(grid[r][c] ^ MASKS[mask](r, c))
        right -= 2
    return [int("".join("1" if b else "0" for b in bits[i:i + 8]), 2) for i in range(0, len(bits) // 8 * 8, 8)]


def data_codewords(words: list[int], version: int, level: str) -> list[int]:
    """The data codewords in order: short blocks first, each block's data read column by column."""
    blocks, ecc = BLOCKS[level][version], ECC_PER_BLOCK[level][version]
    short = blocks - len(words) % blocks
    short_data = len(words) // blocks - ecc
    lengths = [short_data + (j >= short) for j in range(blocks)]
    parts: list[list[int]] = [[] for _ in range(blocks)]
    it = iter(words)
    for i in range(max(lengths)):
        for j in range(blocks):
            if i < lengths[j]:
                parts[j].append(next(it))
    return [w for part in parts for w in part]


def parse(data: list[int], version: int) -> str:
    bits = "".join(f"{w:08b}" for w in data)
    pos, out = 0, []

    def take(n: int) -> int:
        nonlocal pos
        value = int(bits[pos:pos + n] or "0", 2)
        pos += n
        return value

    wide = version >= 10
    while pos + 4 <= len(bits):
        mode = take(4)
        if mode == 0:  # terminator
            break
        if mode == 0b0100:  # bytes (UTF-8 here)
            n = take(16 if wide else 8)
            out.append(bytes(take(8) for _ in range(n)).decode("utf-8"))
        elif mode == 0b0010:  # alphanumeric: pairs in 11 bits
            n = take(11 if wide else 9)
            text = []
            for _ in range(n // 2):
                v = take(11)
                text += [ALNUM[v // 45], ALNUM[v % 45]]
            if n % 2:
                text.append(ALNUM[take(6)])
            out.append("".join(text))
        elif mode == 0b0001:  # numeric: three digits in 10 bits
            n = take(12 if wide else 10)
            text = ""
            for _ in range(n // 3):
                text += f"{take(10):03d}"
            if n % 3:  # one digit left: 4 bits, two: 7
                text += f"{take(4 if n % 3 == 1 else 7):0{n % 3}d}"
            out.append(text)
        elif mode == 0b0111:  # ECI designator (one byte for values below 128)
            take(8)
        else:
            raise AssertionError(f"segment mode {mode:04b} is not read here")
    return "".join(out)


def read_qr(png: bytes) -> str:
    grid = modules(png)
    version = (len(grid) - 17) // 4
    assert 1 <= version <= 10, f"version {version} is not read here"
    level, mask = format_info(grid)
    words = codewords(grid, version, mask)
    return parse(data_codewords(words, version, level), version)
