"""Real-looking inputs for the real-model corpus: rendered text, captchas, speech-like audio, token ids, file bytes.

Every generator is seeded, so a recipe's calibration and validation sets are
reproducible and, with different seeds, disjoint.  Images are written as PNG
files for the recipe's image-folder reader (the preprocessing a user would
declare); everything else as ``.npy``/``.npz`` samples for the npy reader.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import unicodedata
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz0123456789"


# ---- images ----------------------------------------------------------------------------------------------


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _word(rng: np.random.Generator, low: int, high: int) -> str:
    return "".join(LETTERS[int(i)] for i in rng.integers(0, len(LETTERS), int(rng.integers(low, high))))


def document_images(folder: Path, count: int, width: int, height: int, seed: int) -> Path:
    """Pages of dark text lines on light, slightly uneven paper (text detection)."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(count):
        image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(200, 256, 3)))
        draw = ImageDraw.Draw(image)
        top = int(rng.integers(4, 20))
        while top < height - 20:
            size = int(rng.integers(14, 30))
            words = " ".join(_word(rng, 2, 9) for _ in range(int(rng.integers(1, 5))))
            draw.text((int(rng.integers(4, width // 3)), top), words, font=_font(size),
                      fill=tuple(int(v) for v in rng.integers(0, 90, 3)))
            top += size + int(rng.integers(6, 30))
        image.save(folder / f"{index:03d}.png")
    return folder


def seal_images(folder: Path, count: int, width: int, height: int, seed: int) -> Path:
    """Round red stamps (a ring, letters around it, a star inside) on a page with a few dark text lines (seal
    text detection: a page without a stamp leaves its score map near 1e-7, all rounding); the stamp is sized by
    the page's shorter side."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    side = min(width, height)
    for index in range(count):
        image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(205, 256, 3)))
        draw = ImageDraw.Draw(image)
        for top in range(8, side - 16, int(rng.integers(24, 40))):  # the page's own text under the stamp
            draw.text((int(rng.integers(4, side // 4)), top), _word(rng, 3, 12), font=_font(14),
                      fill=tuple(int(v) for v in rng.integers(0, 90, 3)))
        red = (int(rng.integers(190, 240)), int(rng.integers(10, 70)), int(rng.integers(10, 70)))
        radius = int(side * rng.uniform(0.3, 0.42))
        cx, cy = (int(side / 2 + rng.integers(-side // 10, side // 10 + 1)) for _ in range(2))
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), outline=red, width=max(2, side // 48))
        letters = _word(rng, 8, 14).upper()
        for position, letter in enumerate(letters):  # around the upper arc, as stamps write their issuer
            angle = np.pi * (1.1 + 0.8 * position / max(len(letters) - 1, 1))
            x, y = cx + 0.72 * radius * np.cos(angle), cy + 0.72 * radius * np.sin(angle)
            draw.text((int(x) - 6, int(y) - 8), letter, font=_font(max(12, side // 16)), fill=red)
        star = [(cx + radius * 0.25 * np.cos(a) * (1 if k % 2 == 0 else 0.4),
                 cy + radius * 0.25 * np.sin(a) * (1 if k % 2 == 0 else 0.4))
                for k, a in enumerate(np.linspace(-np.pi / 2, 1.5 * np.pi, 10, endpoint=False))]
        draw.polygon(star, fill=red)
        image.save(folder / f"{index:03d}.png")
    return folder


def text_line_images(folder: Path, count: int, width: int, height: int, seed: int, *,
                     captcha: bool = False) -> Path:
    """One line of text per image (recognition); ``captcha`` adds noise lines and dots as captchas have."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(count):
        image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(170, 256, 3)))
        draw = ImageDraw.Draw(image)
        low, high = (height * 2 // 5, height * 3 // 5) if captcha else (height // 2, height * 4 // 5)
        size = int(rng.integers(low, high))
        text = _word(rng, 4, 7) if captcha else " ".join(_word(rng, 2, 8) for _ in range(int(rng.integers(1, 4))))
        draw.text((int(rng.integers(2, max(3, width // 8))), int(rng.integers(0, max(1, height - size)))), text,
                  font=_font(size), fill=tuple(int(v) for v in rng.integers(0, 110, 3)))
        if captcha:
            _captcha_noise(draw, rng, width, height)
        image.save(folder / f"{index:03d}.png")
    return folder


def _captcha_noise(draw, rng: np.random.Generator, width: int, height: int) -> None:
    for _ in range(int(rng.integers(2, 5))):
        points = [(int(rng.integers(0, width)), int(rng.integers(0, height))) for _ in range(2)]
        draw.line(points, fill=tuple(int(v) for v in rng.integers(0, 200, 3)), width=int(rng.integers(1, 3)))
    for _ in range(int(rng.integers(30, 80))):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        draw.point((x, y), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))


def click_captcha_images(folder: Path, count: int, size: int, seed: int) -> Path:
    """Scattered large characters over a photo-like gradient with blobs (the detector's click captchas)."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:size, 0:size] / size
    for index in range(count):
        base = rng.uniform(40, 200, 3)[None, None] + rng.uniform(-60, 60, 3)[None, None] * (xs + ys)[..., None] / 2
        image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(3, 8))):
            (x, y), r = (int(v) for v in rng.integers(0, size, 2)), int(rng.integers(10, 60))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        for _ in range(int(rng.integers(3, 6))):
            glyph_size = int(rng.integers(36, 64))
            where = tuple(int(v) for v in rng.integers(0, size - glyph_size, 2))
            draw.text(where, LETTERS[int(rng.integers(0, 24))], font=_font(glyph_size),
                      fill=tuple(int(v) for v in rng.integers(0, 256, 3)), stroke_width=2,
                      stroke_fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        image.save(folder / f"{index:03d}.png")
    return folder


def face_like_images(folder: Path, count: int, width: int, height: int, seed: int) -> Path:
    """Smooth colour backgrounds with one to three skin-toned ovals, each with two eyes and a mouth."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    for index in range(count):
        rng = np.random.default_rng(seed * 1000 + index)
        image = np.stack([100 + 60 * np.sin(x / rng.uniform(20, 80) + c) * np.cos(y / rng.uniform(20, 80))
                          for c in range(3)], axis=-1)
        for _ in range(rng.integers(1, 4)):
            cy, cx = rng.uniform(0.2, 0.8) * height, rng.uniform(0.15, 0.85) * width
            r = rng.uniform(0.06, 0.16) * height
            skin = np.array([210, 160, 140]) + rng.uniform(-30, 30)
            image[((y - cy) / (1.3 * r)) ** 2 + ((x - cx) / r) ** 2 < 1] = skin
            for side in (-0.4, 0.4):
                image[(y - cy + 0.3 * r) ** 2 + (x - cx - side * r) ** 2 < (0.12 * r) ** 2] = 30
            image[(np.abs(y - cy - 0.5 * r) < 0.08 * r) & (np.abs(x - cx) < 0.35 * r)] = 60
        image += rng.normal(0, 4, image.shape)
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(folder / f"{index:03d}.png")
    return folder


# ---- audio -----------------------------------------------------------------------------------------------


def speech_like(seconds: float, rate: int, seed: int) -> np.ndarray:
    """Voiced syllables (harmonics of a drifting pitch, two formant-like peaks, a 4 Hz envelope) between pauses,
    over background noise: what a voice-activity detector hears, in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = rng.uniform(90, 240) * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.3, 1.5) * t))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    formants = rng.uniform([300, 900], [900, 2500])
    voiced = sum(np.sin(k * phase) / k * (np.exp(-((k * pitch - formants[0]) / 250) ** 2)
                                          + 0.6 * np.exp(-((k * pitch - formants[1]) / 400) ** 2) + 0.05)
                 for k in range(1, 30))
    syllables = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, np.pi)), 0, None) ** 2
    talking = (np.sin(2 * np.pi * t / rng.uniform(0.8, 1.6) + rng.uniform(0, 6)) > -0.3).astype(float)
    noise = rng.standard_normal(t.size) * rng.uniform(0.002, 0.02)
    signal = voiced * syllables * talking + noise
    return (0.6 * signal / np.max(np.abs(signal))).astype(np.float32)


def eeg_like(seconds: float, rate: int, seed: int) -> np.ndarray:
    """Sleep EEG in microvolts: 1/f background, an alpha rhythm and two to five spindles (11-15 Hz bursts of
    0.5-2 s with a smooth envelope), what a spindle detector reads."""
    rng = np.random.default_rng(seed)
    count = int(seconds * rate)
    t = np.arange(count) / rate
    spectrum = (rng.normal(size=count // 2 + 1) + 1j * rng.normal(size=count // 2 + 1))
    signal = np.fft.irfft(spectrum / np.sqrt(np.maximum(np.arange(count // 2 + 1), 1)), count) * 30
    signal += 10 * np.sin(2 * np.pi * rng.uniform(8, 11) * t)
    for _ in range(int(rng.integers(2, 6))):
        start, length = rng.uniform(0, seconds - 2), rng.uniform(0.5, 2)
        inside = (t >= start) & (t < start + length)
        envelope = np.sin(np.pi * (t[inside] - start) / length) ** 2
        signal[inside] += rng.uniform(20, 50) * envelope * np.sin(2 * np.pi * rng.uniform(11, 15) * t[inside])
    return signal


def music_like(samples: int, rate: int, seed: int) -> np.ndarray:
    """Two to five notes (harmonic tones of MIDI pitches 40-90, a sharp attack and an exponential decay) over
    faint noise, in [-1, 1]: what a note transcriber hears."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / rate
    signal = rng.normal(0, 0.003, samples)
    for _ in range(rng.integers(2, 6)):
        pitch = 440 * 2 ** ((rng.integers(40, 90) - 69) / 12)
        start, length = rng.uniform(0, 0.75 * t[-1]), rng.uniform(0.2, 1.2)
        after = np.clip(t - start, 0, None)
        envelope = np.clip(after / 0.01, 0, 1) * np.exp(-after * rng.uniform(1, 5)) * (t < start + length)
        signal += envelope * sum(np.sin(2 * np.pi * pitch * k * t + rng.uniform(0, 6)) * 0.3 / k for k in range(1, 6))
    return (signal / max(1.0, np.abs(signal).max())).astype(np.float32)


# ---- text ------------------------------------------------------------------------------------------------

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Quantization trades a little accuracy for a smaller and faster model.",
    "A deployment engineer compares latency on two runtimes before shipping.",
    "Rain is expected in the northern valleys by Thursday afternoon.",
    "She reorganised the kitchen shelves so the spices are easier to reach.",
    "Which train leaves for Lisbon after nine in the evening?",
    "The museum's new wing displays pottery from the bronze age.",
    "Please restart the router if the connection keeps dropping.",
    "Sentence embeddings map texts with similar meaning to nearby vectors.",
    "Our team shipped the release a day early thanks to careful testing.",
    "He forgot his umbrella at the cafe near the station again.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Graph optimizations fold constants and fuse batch normalization into convolutions.",
    "Children were flying kites on the hill behind the school.",
    "How do I reset my password when the email never arrives?",
    "The orchestra rehearsed the final movement late into the night.",
    "Solar panels on the roof now cover most of the building's power.",
    "A voice activity detector tells speech from silence in short audio frames.",
    "The committee postponed its decision until the budget review.",
    "Fresh bread smells wonderful early in the morning.",
    "Stock prices fell sharply after the quarterly report was published.",
    "My grandmother still writes letters by hand every Sunday.",
    "The hikers reached the summit just before the clouds rolled in.",
    "Type hints make a large Python codebase easier to read and refactor.",
)


def wordpiece_ids(text: str, vocab: dict[str, int], length: int) -> tuple[np.ndarray, np.ndarray]:
    """BERT uncased tokenization ([CLS] word pieces [SEP], padded with [PAD]): input ids and attention mask."""
    text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
    words = "".join(f" {c} " if unicodedata.category(c).startswith("P") else c for c in text).split()
    ids = [vocab["[CLS]"]]
    for word in words:
        ids.extend(_word_pieces(word, vocab))
    ids = [*ids[:length - 1], vocab["[SEP]"]]
    mask = [1] * len(ids) + [0] * (length - len(ids))
    ids += [vocab["[PAD]"]] * (length - len(ids))
    return np.asarray([ids], np.int64), np.asarray([mask], np.int64)


def _word_pieces(word: str, vocab: dict[str, int]) -> list[int]:
    """Greedy longest-match-first word pieces; [UNK] for a word that cannot be split."""
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                pieces.append(vocab[piece])
                start = end
                break
        else:
            return [vocab["[UNK]"]]
    return pieces


def read_vocab(path: Path) -> dict[str, int]:
    return {line.rstrip("\n"): index for index, line in enumerate(path.read_text(encoding="utf-8").splitlines())}


# ---- file bytes ------------------------------------------------------------------------------------------


def _png(rng: np.random.Generator, kind: str = "PNG") -> bytes:
    from PIL import Image

    pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8).cumsum(axis=1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, kind)
    return out.getvalue()


def _zip(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("notes.txt", " ".join(SENTENCES[int(i)] for i in rng.integers(0, len(SENTENCES), 20)))
    return out.getvalue()


def _tar(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        payload = json.dumps({"seed": int(rng.integers(0, 1000))}).encode()
        info = tarfile.TarInfo("config.json")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def _python(rng: np.random.Generator) -> bytes:
    body = "\n".join(f"def f{i}(x: int) -> int:\n    return x * {int(rng.integers(2, 99))} + {i}\n" for i in range(30))
    return f'"""Helpers."""\nimport math\n\n{body}'.encode()


FILE_MAKERS: dict[str, Callable[[np.random.Generator], bytes]] = {
    "png": _png,
    "jpeg": lambda rng: _png(rng, "JPEG"),
    "gif": lambda rng: _png(rng, "GIF"),
    "bmp": lambda rng: _png(rng, "BMP"),
    "zip": _zip,
    "tar": _tar,
    "gzip": lambda rng: gzip.compress(_python(rng), mtime=0),
    "python": _python,
    "json": lambda rng: json.dumps({"items": [{"id": int(i), "name": SENTENCES[int(i) % 24]}
                                              for i in rng.integers(0, 500, 40)]}, indent=2).encode(),
    "csv": lambda rng: "\n".join(",".join(str(int(v)) for v in row)
                                 for row in rng.integers(0, 10_000, (120, 6))).encode(),
    "html": lambda rng: ("<!DOCTYPE html><html><head><title>Report</title></head><body>"
                         + "".join(f"<p>{SENTENCES[int(i)]}</p>" for i in rng.integers(0, 24, 30))
                         + "</body></html>").encode(),
    "markdown": lambda rng: "\n\n".join(f"## Part {i}\n\n- {SENTENCES[int(j)]}"
                                        for i, j in enumerate(rng.integers(0, 24, 25))).encode(),
    "shell": lambda rng: ("#!/bin/sh\nset -eu\n" + "".join(f"echo step {int(i)}\nsleep 1\n"
                                                            for i in rng.integers(0, 100, 40))).encode(),
    "randombytes": lambda rng: rng.integers(0, 256, 3000, dtype=np.uint8).tobytes(),
    "ini": lambda rng: "".join(f"[section{i}]\nkey = {int(v)}\nname = item{i}\n\n"
                               for i, v in enumerate(rng.integers(0, 99, 40))).encode(),
    "sql": lambda rng: "".join(f"INSERT INTO items (id, price) VALUES ({int(i)}, {int(v)});\n"
                               for i, v in rng.integers(0, 999, (60, 2))).encode(),
}


def magika_features(content: bytes, beg_size: int, end_size: int, padding: int, block: int) -> np.ndarray:
    """Magika's model input for a file: its first and last bytes after stripping whitespace, padded."""
    short = len(content) <= block
    beg = content[:block].strip() if short else content[:block].lstrip()
    end = content[-block:].strip() if short else content[-block:].rstrip()
    beg_ints = list(beg[:beg_size]) + [padding] * max(0, beg_size - len(beg))
    end_ints = [padding] * max(0, end_size - len(end)) + list(end[-end_size:] if end_size else b"")
    return np.asarray([beg_ints + end_ints], np.int32)


def word_segmenter_features(source: Path, titles: Path, count: int, characters: int,
                            seed: int) -> list[dict[str, np.ndarray]]:
    """Inputs of PyThaiNLP's DeepCut word segmenter for ``count`` texts of ``characters`` characters each, made of
    Thai Wikipedia titles (``titles``, one per line) joined by spaces: per character, the 21 character ids and
    character-type ids of its window (``input_1``, ``input_2``, floats), as ``pythainlp/tokenize/deepcut.py``
    (``source``) builds them.  Its tables are read out of that file, not copied here."""
    import ast

    tables: dict[str, object] = {}
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None \
                and node.target.id in ("_CHARS", "_CHAR_TYPES", "_CHAR_TYPE", "_N_PAD"):
            tables[node.target.id] = ast.literal_eval(node.value)
    chars = {char: index for index, char in enumerate(tables["_CHARS"])}
    kinds = {kind: index for index, kind in enumerate(tables["_CHAR_TYPES"])}
    kind_of = {char: kind for group, kind in tables["_CHAR_TYPE"].items() for char in group}
    other_char, other_kind, window = chars.get("other", 80), kinds.get("o", 4), int(tables["_N_PAD"])
    lines = [line for line in titles.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        text = ""
        while len(text) < characters:
            text += " ".join(lines[int(i)] for i in rng.integers(0, len(lines), 3)) + " "
        half = (window - 1) // 2
        padded = [" "] * half + list(text[:characters]) + [" "] * half
        windows = [padded[i + 1:i + half + 1] + padded[i - half:i][::-1] + [padded[i]]
                   for i in range(half, half + characters)]
        samples.append({
            "input_1": np.array([[chars.get(c, other_char) for c in w] for w in windows], np.float32),
            "input_2": np.array([[kinds.get(kind_of.get(c, "o"), other_kind) for c in w] for w in windows],
                                np.float32)})
    return samples


def transliterator_decoder_feeds(encoder: Path, decoder: Path, vocabulary: Path, titles: Path, count: int,
                                 seed: int) -> list[dict[str, np.ndarray]]:
    """Inputs of one step of PyThaiNLP's thai2rom attention decoder, as its romanizer feeds them: a Thai word (a
    Wikipedia title without spaces) encoded by the encoder, then 0 to 3 greedy decoding steps before the one kept
    (the previous token, the LSTM state carried over, the encoder's outputs and their mask)."""
    import onnxruntime as ort

    table = json.loads(vocabulary.read_text(encoding="utf-8"))
    chars, targets = table["char_to_ix"], table["target_char_to_ix"]
    words = [line for line in titles.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith("#") and " " not in line and 3 <= len(line) <= 12]
    encode = ort.InferenceSession(str(encoder), providers=["CPUExecutionProvider"])
    decode = ort.InferenceSession(str(decoder), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        word = words[int(rng.integers(0, len(words)))]
        ids = np.array([[chars.get(c, chars["<UNK>"]) for c in word] + [chars["<end>"]]], np.int64)
        outputs, hidden_1, _ = encode.run(None, {"input_tensor": ids, "input_lengths": np.array([ids.shape[1]],
                                                                                               np.int32)})
        feed = {"decoder_input": np.array([[targets["<start>"]]], np.int32),
                "decoder_hidden_1": np.concatenate((hidden_1[0], hidden_1[1]), axis=1)[None].astype(np.float32),
                "encoder_outputs": outputs, "mask": np.ones((1, outputs.shape[1]), np.float32)}
        for _ in range(int(rng.integers(0, 4))):
            scores, state = decode.run(["decoder_output", "decoder_hidden_2"], feed)
            feed = {**feed, "decoder_input": scores.argmax(1).astype(np.int32)[None], "decoder_hidden_1": state}
        samples.append(feed)
    return samples
