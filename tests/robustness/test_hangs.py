"""Inputs that made qdeploy hang or spin: each now ends in exit 2 within seconds, naming the file or field.

Every case runs the CLI in a fresh interpreter under a timeout, since the old code never returned: a model
path naming /dev/zero, /dev/urandom or a FIFO was hashed before it was checked, a FIFO in a data folder
blocked the reader, an alias bomb took minutes of CPU, a 50 MB recipe 78 s.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qdeploy.calibration.readers import InputInfo, npy_samples
from qdeploy.core.errors import QdeployInputError
from tests.robustness.helpers import RECIPE, assert_clean_input_error, recipe_with_model, run_cli

LIMIT = 60
"""Seconds a case may take in a subprocess; each takes about two (starting Python), the old code for ever."""


def _timed_cli(*args: str) -> tuple[Any, float]:
    started = time.monotonic()
    result = run_cli(*args, timeout=LIMIT)
    return result, time.monotonic() - started


def _command(command: str, recipe: Path) -> list[str]:
    return [command, str(recipe), *(("-q", "--out", str(recipe.parent / "o")) if command == "run" else ())]


def _returns_within(seconds: float, call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a daemon thread; fail if it has not returned in time, else the exception it raised."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s"
    return outcome[0]


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/urandom"])
def test_a_model_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, kind: str, command: str) -> None:
    recipe = recipe_with_model(tmp_path)
    model = kind
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.onnx")
        model = "pipe.onnx"
    recipe.write_text(recipe.read_text().replace("model.onnx", model))
    result, seconds = _timed_cli(*_command(command, recipe))
    assert_clean_input_error(result, f"{recipe}:2", "model.onnx", model,
                             "named pipe" if kind == "fifo" else "is a device")
    assert seconds < LIMIT
    assert not (tmp_path / "o" / "report.json").exists()


@pytest.mark.parametrize(("command", "kind"), [("check", "fifo"), ("run", "/dev/zero"), ("sweep", "fifo")])
def test_a_recipe_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, command: str,
                                                                      kind: str) -> None:
    recipe = Path(kind)
    if kind == "fifo":
        recipe = tmp_path / "recipe.yaml"
        os.mkfifo(recipe)
    extra = ("--out", str(tmp_path / "o")) if command != "check" else ()
    result, _ = _timed_cli(command, str(recipe), *extra, "-q")
    if command == "sweep":  # a sweep reports an invalid recipe in its report and exits 2
        result.stderr += json.loads((tmp_path / "o" / "sweep.json").read_text())["recipes"][0]["reason"]
    assert_clean_input_error(result, recipe.name, "named pipe" if kind == "fifo" else "is a device")


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_fifo_among_npy_samples_is_refused(tmp_path: Path, command: str) -> None:
    data = tmp_path / "calib"
    data.mkdir()
    np.save(data / "a.npy", np.zeros((1, 3, 16, 16), np.float32))
    os.mkfifo(data / "b.npy")
    body = RECIPE.replace("calib: {reader: random, samples: 4}", "calib: {reader: npy, path: calib}")
    recipe = recipe_with_model(tmp_path, body=body)
    result, _ = _timed_cli(*_command(command, recipe))
    assert_clean_input_error(result, "data.calib.path", "b.npy", "named pipe")


def test_a_fifo_among_images_is_refused_by_check(tmp_path: Path) -> None:
    from PIL import Image

    data = tmp_path / "images"
    data.mkdir()
    Image.new("RGB", (16, 16)).save(data / "a.png")
    os.mkfifo(data / "b.png")
    body = RECIPE.replace("calib: {reader: random, samples: 4}", "calib: {reader: images, path: images}")
    recipe = recipe_with_model(tmp_path, body=body)
    result, _ = _timed_cli("check", str(recipe))
    assert_clean_input_error(result, "data.calib.path", "b.png", "named pipe")


@pytest.mark.parametrize("reader", ["npy", "images"])
def test_the_readers_themselves_never_open_a_fifo(tmp_path: Path, reader: str) -> None:
    """A folder that gains a FIFO after the recipe was checked: the reader refuses it instead of blocking."""
    from qdeploy.calibration.images import image_samples
    from qdeploy.pipeline.recipe.schema import DatasetSpec

    os.mkfifo(tmp_path / ("b.npy" if reader == "npy" else "b.png"))
    info = [InputInfo("input", (1, 3, 16, 16), np.dtype(np.float32))]
    if reader == "npy":
        read = lambda: list(npy_samples(tmp_path, info))  # noqa: E731
    else:
        spec = DatasetSpec(reader="images", path=".")
        read = lambda: list(image_samples(tmp_path, info, spec))  # noqa: E731
    error = _returns_within(10, read)
    assert isinstance(error, QdeployInputError) and "named pipe" in str(error), error


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["  - &a0 [" + ", ".join(["ort:cpu"] * width) + "]"]
    lines += [f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "targets:\n" + "\n".join(lines)


def test_an_alias_bomb_in_a_validated_field_is_refused_in_seconds(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path, body=RECIPE.replace("targets: [ort:cpu]", _alias_bomb()))
    result, seconds = _timed_cli("check", str(recipe))
    assert_clean_input_error(result, f"{recipe}:", "aliases expand the recipe past")
    assert seconds < LIMIT  # 63-106 s of CPU before


def test_an_alias_bomb_in_a_sweep_file_is_refused_in_seconds(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep: s\n" + _alias_bomb().replace("targets:", "recipes:"))
    result, _ = _timed_cli("check", str(sweep))
    assert_clean_input_error(result, "aliases expand the recipe past")


def test_a_huge_recipe_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    recipe = recipe_with_model(tmp_path)
    with recipe.open("a") as stream:
        stream.write(("# " + "x" * 98 + "\n") * 20_000)  # 2 MB of comments (50 MB took 78 s)
    result, _ = _timed_cli("check", str(recipe))
    assert_clean_input_error(result, str(recipe), "2.0 MB", "at most 1 MB")


@pytest.mark.parametrize("path", ["/proc/kmsg", "/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled"])
def test_a_kernel_pseudo_file_is_refused_before_any_read(path: str) -> None:
    """/proc and /sys files claim to be regular files; /proc/kmsg blocks a read for ever (`qdeploy check` hung)."""
    from qdeploy.core.userfiles import open_regular_file

    if not Path(path).exists():
        pytest.skip(f"{path} does not exist on this machine")
    error = _returns_within(10, lambda: open_regular_file(Path(path), "recipe file").close())
    assert isinstance(error, QdeployInputError) and "kernel pseudo-file" in str(error), error
