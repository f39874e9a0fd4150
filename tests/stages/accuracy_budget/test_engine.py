"""The one accuracy-budget engine on a tiny model: a stage supplies only a builder and a ranking signal.

The model is a chain of three Adds.  Its "reduced" build perturbs the constant of every Add not kept float: the
``loud`` one by a vector whose noise alone breaks a 30 dB SNR, the two others by 1e-4 of it.  The engine must keep
exactly ``loud`` float, confirm it on the held-back samples, and say so in its typed findings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qdeploy.core.tolerance import Tolerance
from qdeploy.stages.accuracy_budget import clock as budget_clock
from qdeploy.stages.accuracy_budget import rank
from qdeploy.stages.accuracy_budget.evaluate import Evaluator, Measured
from qdeploy.stages.accuracy_budget.findings import BudgetFindings
from qdeploy.stages.accuracy_budget.search import BudgetResult, meet_budget
from qdeploy.stages.accuracy_budget.targets import TargetChecks, TargetPlan, TargetRunner

NOISE = {"quiet": 1e-4, "loud": 1.0, "calm": 1e-4}
WIDTH = 8


def _chain(noise: dict[str, float]) -> onnx.ModelProto:
    """x -> Add(quiet) -> Add(loud) -> Add(calm) -> y; each constant offset by ``noise[node]`` times a fixed vector."""
    pattern = np.linspace(-1.0, 1.0, WIDTH, dtype=np.float32)
    nodes, inits, previous = [], [], "x"
    for index, name in enumerate(NOISE):
        value = np.full(WIDTH, 0.1 * (index + 1), dtype=np.float32) + noise.get(name, 0.0) * pattern
        inits.append(helper.make_tensor(f"{name}_c", TensorProto.FLOAT, [WIDTH], value.tolist()))
        output = "y" if index == len(NOISE) - 1 else f"{name}_out"
        nodes.append(helper.make_node("Add", [previous, f"{name}_c"], [output], name=name))
        previous = output
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class ChainBuilder:
    """What a stage supplies: the model with some nodes kept float, and its candidates."""

    def __init__(self) -> None:
        self.builds: list[list[str]] = []

    def __call__(self, kept: list[str]) -> onnx.ModelProto:
        self.builds.append(sorted(kept))
        return _chain({name: level for name, level in NOISE.items() if name not in kept})

    def candidates(self, quantized: onnx.ModelProto) -> dict[str, str]:
        return {node.name: node.op_type for node in quantized.graph.node}


def _signal(quantized: onnx.ModelProto, candidates: dict[str, str], feeds: list) -> dict[str, float]:
    return dict(NOISE)  # the error each node adds by itself, as a stage would measure it


def _feeds(count: int) -> list[dict[str, np.ndarray]]:
    generator = np.random.default_rng(0)
    return [{"x": generator.normal(size=WIDTH).astype(np.float32)} for _ in range(count)]


@pytest.fixture
def float_model(tmp_path: Path) -> Path:
    path = tmp_path / "float.onnx"
    onnx.save(_chain({}), str(path))
    return path


def test_the_engine_keeps_only_the_harmful_node_float_and_confirms_it_on_held_back_samples(
        tmp_path: Path, float_model: Path) -> None:
    build = ChainBuilder()
    result = meet_budget(build, _signal, float_model, _feeds(8), Tolerance(snr_db_min=30.0), tmp_path,
                         max_float_nodes=None)
    assert isinstance(result, BudgetResult) and isinstance(result.findings, BudgetFindings)
    assert result.kept == ["loud"]
    findings = result.findings
    assert findings.met is True and findings.candidates == 3
    assert (findings.samples, findings.search_samples, findings.held_back_samples) == (8, 6, 2)
    assert findings.initial["search"]["passed"] is False and findings.final["held_back"]["passed"] is True
    assert [record.node for record in findings.kept_float] == ["loud"]
    assert findings.ranking.startswith("damage quantized alone (3 evaluations)")
    assert "holds on 2 held-back sample(s)" in findings.confirmed
    assert [] in build.builds and ["loud"] in build.builds


def test_nothing_is_kept_when_the_fully_reduced_model_holds(tmp_path: Path, float_model: Path) -> None:
    build = ChainBuilder()
    result = meet_budget(build, _signal, float_model, _feeds(4), Tolerance(snr_db_min=-20.0), tmp_path,
                         max_float_nodes=None)
    assert result.kept == [] and result.findings.met is True
    assert result.findings.candidates is None  # no search ran: the search's own fields are absent
    assert build.builds == [[]]


def test_a_node_limit_that_is_too_low_is_a_miss_that_says_why(tmp_path: Path, float_model: Path) -> None:
    result = meet_budget(ChainBuilder(), _signal, float_model, _feeds(8), Tolerance(snr_db_min=30.0), tmp_path,
                         max_float_nodes=0)
    assert result.findings.met is False
    assert "max_float_nodes (0) was reached" in (result.findings.note or "")



def _misleading_signal(quantized: onnx.ModelProto, candidates: dict[str, str], feeds: list) -> dict[str, float]:
    """A local error that never reaches the output ranks first (a convolution before a saturating HardSigmoid)."""
    return {"quiet": 1.0, "calm": 0.5, "loud": 1e-6}


def test_above_the_candidate_limit_the_alone_ranking_runs_when_its_evaluations_fit_the_time_left(
        tmp_path: Path, float_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank, "ALONE_RANK_LIMIT", 1)  # three candidates are "many"
    result = meet_budget(ChainBuilder(), _misleading_signal, float_model, _feeds(8), Tolerance(snr_db_min=30.0),
                         tmp_path, max_float_nodes=None)
    assert result.findings.ranking.startswith("damage quantized alone (3 evaluations)")
    assert [record.node for record in result.findings.kept_float] == ["loud"]
    assert result.findings.kept_float[0].rank == 1  # found by its damage, not by the misleading local error


def test_above_the_candidate_limit_the_local_error_ranks_when_the_alone_ranking_would_take_too_long(
        tmp_path: Path, float_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each evaluation "takes" 100 s: after the full one and the first of the ranking, 50 of the 250 s are left
    and three more would take 300 s."""
    monkeypatch.setattr(rank, "ALONE_RANK_LIMIT", 1)
    elapsed = [0.0]
    measure = Evaluator.measure

    def slow(evaluator: Evaluator, *args: object, **kwargs: object) -> Measured:
        elapsed[0] += 100.0
        return measure(evaluator, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(budget_clock, "now", lambda: elapsed[0])
    monkeypatch.setattr(Evaluator, "measure", slow)
    result = meet_budget(ChainBuilder(), _misleading_signal, float_model, _feeds(8), Tolerance(snr_db_min=30.0),
                         tmp_path, max_float_nodes=None, max_seconds=250)
    assert result.findings.ranking == (
        "local error (one run): quantizing each of the 3 candidates alone would take about 300 s, over 75% of the "
        "budget's 50 s left (budget.max_seconds gives it more)")

class _Session:
    """A target that breaks the loud node at its bf16 default, and runs correctly pinned to f32."""

    def __init__(self, path: Path, hint: str | None) -> None:
        self.path, self.hint = path, hint
        self.executed = type("Executed", (), {"precision": hint or "bf16"})()

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        session = ort.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])
        y = session.run(None, feed)[0]
        return {"y": y + (0.0 if self.hint == "f32" else 1.0)}

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_a_target_missing_at_its_default_is_confirmed_pinned_and_each_kept_set_is_measured_once(
        tmp_path: Path, float_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qdeploy.targets.int8_path import FLAGS_ENV

    monkeypatch.setenv(FLAGS_ENV, "avx2 avx512f avx512_bf16")  # a bf16 default, no f16: f32 is the pin
    loads: list[str | None] = []

    def load(target: str, path: Path, hint: str | None = None) -> _Session:
        loads.append(hint)
        return _Session(path, hint)

    feeds = _feeds(4)
    search = Evaluator(float_model, feeds, [], Tolerance(snr_db_min=30.0), tmp_path)
    checks = TargetChecks(search, [TargetPlan("openvino:cpu", TargetRunner("openvino:cpu", load))])
    model = _chain({})
    assert checks.confirm(model, []) == []
    record = checks.verdicts()["openvino:cpu"]
    assert record.status == "confirmed" and record.deploy_precision == "f32" and record.precision == "f32"
    assert record.default is not None and record.default.status == "missed" and record.default.precision == "bf16"
    assert loads == [None, "f32"]
    assert checks.holds_on(["openvino:cpu"], [], lambda: pytest.fail("measured already")) is False  # the default
    assert checks.cost()["openvino:cpu"].evaluations == 2


def test_an_evaluator_given_its_reference_compares_pooled_when_asked(tmp_path: Path) -> None:
    from qdeploy.core.compare import compare_outputs

    reference = [{"y": np.ones(WIDTH, dtype=np.float32)}, {"y": np.full(WIDTH, 100.0, dtype=np.float32)}]
    candidate = [{"y": np.full(WIDTH, 1.5, dtype=np.float32)}, {"y": np.full(WIDTH, 100.0, dtype=np.float32)}]
    tolerance = Tolerance(snr_db_min=20.0)
    pooled = Evaluator(None, [{}, {}], [], tolerance, tmp_path, reference=Measured(reference, []),
                       compare=compare_outputs)
    per_sample = Evaluator(None, [{}, {}], [], tolerance, tmp_path, reference=Measured(reference, []))
    measured = Measured(candidate, [])
    assert pooled.on_search(measured).passed  # the loud second sample hides the first one's error
    assert not per_sample.on_search(measured).passed  # worst_of: every sample on its own too
