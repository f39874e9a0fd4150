"""Rendered text-line images, the data of the real OCR models' tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def text_images(folder: Path, count: int, width: int, height: int, seed: int) -> Path:
    """Lines of capital letters rendered on light backgrounds."""
    from PIL import Image, ImageDraw, ImageFont

    folder.mkdir()
    rng = np.random.default_rng(seed)
    for index in range(count):
        image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(180, 256, 3)))
        draw = ImageDraw.Draw(image)
        font = ImageFont.load_default(size=int(rng.integers(max(12, height // 3), max(14, height * 3 // 4))))
        for _ in range(1 if height <= 64 else 4):
            text = "".join(chr(int(c)) for c in rng.integers(65, 91, int(rng.integers(4, 12))))
            where = (int(rng.integers(0, width // 2)), int(rng.integers(0, max(1, height - height // 2))))
            draw.text(where, text, fill=tuple(int(v) for v in rng.integers(0, 80, 3)), font=font)
        image.save(folder / f"{index:02d}.png")
    return folder
