"""The demo recipe shows what both benchmark modes measure, in a run that stays short (issue 29)."""

from __future__ import annotations

from qdeploy.core.runtimes import built_for
from qdeploy.pipeline.recipe.loader import load_recipe_file
from tests.helpers.models import REPO


def test_the_demo_measures_latency_and_throughput_briefly() -> None:
    recipe = load_recipe_file(REPO / "recipes" / "demo.yaml")
    benchmark = recipe.benchmark
    assert benchmark.enabled and benchmark.mode == "both"  # a first run shows the throughput table too
    settings = benchmark.throughput_settings
    # ort:cpu and openvino:cpu (the GPU targets are unavailable on CPU machines); int8@ort runs on ort:cpu only
    cpu_pairs = sum(built_for(variant, target) for variant in recipe.variants for target in ("ort:cpu", "openvino:cpu"))
    assert cpu_pairs * (settings.seconds + settings.warmup_seconds) <= 20  # throughput adds at most ~20 s
