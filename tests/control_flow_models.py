"""Small models with control flow for the tests: nested If/Loop/Scan, outer-scope reads, an LSTM in a branch, a
recurrence whose float noise grows, loops that carry values through unchanged, an If on a [1, 1] condition."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(7)
HIDDEN, FEATURES = 8, 16


def _vi(name: str, shape: list | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def nested_constant_if_model() -> onnx.ModelProto:
    """Silero VAD's shape: inside a branch, an If whose condition folds to a constant takes a branch that holds
    another If, whose branches read a value computed in the branch being inlined (``g``) and one from the top
    graph (``xr``).  onnxoptimizer's own eliminate_if_with_const_cond loses ``g``'s producer."""
    inner_then = helper.make_graph([_const("one_a", np.ones(3, np.float32)),
                                    helper.make_node("Add", ["g", "one_a"], ["ia"]),
                                    helper.make_node("Mul", ["ia", "xr"], ["iam"])],
                                   "inner_then", [], [_vi("iam", [3])])
    inner_else = helper.make_graph([helper.make_node("Sub", ["g", "xr"], ["ib"])], "inner_else", [], [_vi("ib", [3])])
    taken = helper.make_graph([
        helper.make_node("Neg", ["xr"], ["g"]),
        helper.make_node("If", ["c2"], ["b_out"], then_branch=inner_then, else_branch=inner_else)],
        "taken", [], [_vi("b_out", [3])])
    not_taken = helper.make_graph([helper.make_node("Identity", ["xr"], ["nt"])], "not_taken", [], [_vi("nt", [3])])
    branch = helper.make_graph([
        _const("k1", np.array([2], np.int64)), _const("k2", np.array([2], np.int64)),
        helper.make_node("Equal", ["k1", "k2"], ["keq"]), helper.make_node("Squeeze", ["keq"], ["kcond"]),
        helper.make_node("If", ["kcond"], ["t_out"], then_branch=taken, else_branch=not_taken)],
        "outer_then", [], [_vi("t_out", [3])])
    other = helper.make_graph([helper.make_node("Abs", ["xr"], ["e_out"])], "outer_else", [], [_vi("e_out", [3])])
    nodes = [helper.make_node("Relu", ["x"], ["xr"]),
             helper.make_node("If", ["c1"], ["y"], then_branch=branch, else_branch=other)]
    graph = helper.make_graph(nodes, "nested", [_vi("x", [3]), _vi("c1", [], TensorProto.BOOL),
                                                _vi("c2", [], TensorProto.BOOL)], [_vi("y", [3])])
    return _model(graph)


def lstm_branch_model() -> onnx.ModelProto:
    """A voice-activity-like model: If on the sample rate; each branch runs its own LSTM on an outer-scope tensor
    and reads an outer initializer; constant work inside the branches folds."""
    def branch(tag: str, scale: float) -> onnx.GraphProto:
        weights = [numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), f"{name}_{tag}")
                   for name, shape in (("W", (1, 4 * HIDDEN, FEATURES)), ("R", (1, 4 * HIDDEN, HIDDEN)),
                                       ("B", (1, 8 * HIDDEN)))]
        nodes = [
            _const(f"c_{tag}", np.array([scale / 2], np.float32)),
            helper.make_node("Add", [f"c_{tag}", f"c_{tag}"], [f"s_{tag}"]),
            helper.make_node("Mul", ["xt", f"s_{tag}"], [f"xs_{tag}"]),
            helper.make_node("Transpose", [f"xs_{tag}"], [f"xT_{tag}"], perm=[1, 0, 2]),
            helper.make_node("LSTM", [f"xT_{tag}", f"W_{tag}", f"R_{tag}", f"B_{tag}"], [f"Y_{tag}", f"h_{tag}"],
                             hidden_size=HIDDEN),
            helper.make_node("Squeeze", [f"h_{tag}", "axes0"], [f"out_{tag}"]),
        ]
        return helper.make_graph(nodes, f"branch_{tag}", [], [_vi(f"out_{tag}", ["N", HIDDEN])], weights)

    nodes = [helper.make_node("Equal", ["sr", "k16000"], ["is16k"]),
             helper.make_node("Relu", ["x"], ["xt"]),
             helper.make_node("If", ["is16k"], ["h"], then_branch=branch("a", 2.0), else_branch=branch("b", 0.5)),
             helper.make_node("MatMul", ["h", "proj"], ["logit"]),
             helper.make_node("Sigmoid", ["logit"], ["p"])]
    inits = [numpy_helper.from_array(np.array(16000, np.int64), "k16000"),
             numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array((RNG.standard_normal((HIDDEN, 1)) * 0.5).astype(np.float32), "proj")]
    graph = helper.make_graph(nodes, "vad", [_vi("x", ["N", "T", FEATURES]), _vi("sr", [], TensorProto.INT64)],
                              [_vi("p", ["N", 1])], inits)
    return _model(graph)


def loop_with_outer_reads_model() -> onnx.ModelProto:
    """A Loop whose body reads an outer-scope tensor and holds an If on the iteration number."""
    then = helper.make_graph([helper.make_node("Mul", ["acc", "w"], ["m"])], "then", [], [_vi("m", [4])])
    other = helper.make_graph([helper.make_node("Add", ["acc", "xw"], ["a"])], "else", [], [_vi("a", [4])])
    body = helper.make_graph([
        _const("two", np.array(2, np.int64)), helper.make_node("Mod", ["i", "two"], ["r"]),
        _const("zero", np.array(0, np.int64)), helper.make_node("Equal", ["r", "zero"], ["even"]),
        helper.make_node("If", ["even"], ["acc_next"], then_branch=then, else_branch=other),
        helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond", [], TensorProto.BOOL), _vi("acc", [4])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_next", [4])])
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("Loop", ["n", "keep_going", "x"], ["y"], body=body)]
    # An explicit condition: onnx.reference's Loop ignores the trip count without one (a known defect).
    inits = [numpy_helper.from_array(np.array(3, np.int64), "n"), numpy_helper.from_array(np.array(True), "keep_going"),
             numpy_helper.from_array(np.array([0.5, 1.0, -1.0, 2.0], np.float32), "w")]
    return _model(helper.make_graph(nodes, "loop", [_vi("x", [4])], [_vi("y", [4])], inits))


def chaotic_recurrence_model(steps: int = 60, hidden: int = 32, gain: float = 1.5) -> onnx.ModelProto:
    """A recurrent decoder's numerics in small: x -> Conv(1x1) -> Div by a per-channel constant -> a Loop of
    ``steps`` steps h <- Tanh(LayerNorm(h @ W)), W orthogonal times ``gain`` (a non-contracting update that
    carries every rounding forward and grows it).  The LayerNorm is written out in primitives, which ONNX
    Runtime fuses into one kernel at its higher optimisation levels: the model's own outputs then differ
    between ORT_DISABLE_ALL and ORT_ENABLE_ALL by far more than 1e-4 (about 2e-3 at 60 steps).  Simplify folds
    the Div into the Conv's weights: a division by 2 is exact either way, the one by 1.3 (channel 0) is not, so
    the first state differs in one value by a rounding, and the output by about as much as the model's own noise
    (1.5 to 2 times it)."""
    rng = np.random.default_rng(1)
    orthogonal, _ = np.linalg.qr(rng.standard_normal((hidden, hidden)))
    body = helper.make_graph([
        helper.make_node("MatMul", ["h", "W"], ["pre"]),
        helper.make_node("ReduceMean", ["pre"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["pre", "mu"], ["dev"]),
        helper.make_node("Pow", ["dev", "two"], ["dev2"]),
        helper.make_node("ReduceMean", ["dev2"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["dev", "std"], ["normed"]),
        helper.make_node("Mul", ["normed", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["ln"]),
        helper.make_node("Tanh", ["ln"], ["h_next"]),
        helper.make_node("Identity", ["cond"], ["cond_out"])], "step",
        [_vi("i", [], TensorProto.INT64), _vi("cond", [], TensorProto.BOOL), _vi("h", [1, hidden])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("h_next", [1, hidden])])
    nodes = [helper.make_node("Unsqueeze", ["x", "axis2"], ["x3"]),
             helper.make_node("Conv", ["x3", "conv_w"], ["conv"]),
             helper.make_node("Div", ["conv", "divisor"], ["h0_3"]),
             helper.make_node("Squeeze", ["h0_3", "axis2"], ["h0"]),
             helper.make_node("Loop", ["n", "keep_going", "h0"], ["y"], body=body)]
    arrays = {"n": np.array(steps, np.int64), "keep_going": np.array(True), "axis2": np.array([2], np.int64),
              "conv_w": (rng.standard_normal((hidden, hidden, 1)) / np.sqrt(hidden)).astype(np.float32),
              "divisor": np.array([1.3] + [2.0] * (hidden - 1), np.float32).reshape(1, hidden, 1),
              "W": (orthogonal * gain).astype(np.float32), "two": np.array(2, np.float32),
              "eps": np.array(1e-5, np.float32), "gamma": np.full(hidden, 1.5, np.float32),
              "beta": np.zeros(hidden, np.float32)}
    inits = [numpy_helper.from_array(value, name) for name, value in arrays.items()]
    return _model(helper.make_graph(nodes, "decoder", [_vi("x", [1, hidden])], [_vi("y", [1, hidden])], inits))


def pass_through_loop_model(steps: int = 3, *, nested: bool = False) -> onnx.ModelProto:
    """Paddle2ONNX's decoder pattern: a Loop of ``steps`` steps that carries its loop-invariant weights as
    loop-carried values and returns them unchanged (body output = body input), beside h <- Tanh(h @ w + b).
    OpenVINO's ONNX frontend refuses such a Loop.  ``nested``: the Loop sits in the body of an outer Loop of 2
    steps, which carries ``w`` through unchanged too."""
    rng = np.random.default_rng(3)
    body = helper.make_graph([
        helper.make_node("MatMul", ["h", "w_in"], ["hw"]),
        helper.make_node("Add", ["hw", "b_in"], ["hb"]),
        helper.make_node("Tanh", ["hb"], ["h_next"]),
        helper.make_node("Identity", ["cond"], ["cond_out"])], "step",
        [_vi("i", [], TensorProto.INT64), _vi("cond", [], TensorProto.BOOL), _vi("h", [1, 4]), _vi("w_in", [4, 4]),
         _vi("b_in", [4])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("h_next", [1, 4]), _vi("w_in", [4, 4]), _vi("b_in", [4])])
    inner = helper.make_node("Loop", ["n", "keep_going", "x", "w", "b"], ["y", "w_last", "b_last"], body=body)
    arrays = {"n": np.array(steps, np.int64), "keep_going": np.array(True),
              "w": (rng.standard_normal((4, 4)) * 0.5).astype(np.float32),
              "b": rng.standard_normal(4).astype(np.float32)}
    if nested:
        inner.input[:] = ["n", "keep_going", "h_outer", "w_outer", "b"]
        outer_body = helper.make_graph([inner, helper.make_node("Identity", ["c_outer"], ["c_outer_out"])], "outer",
                                       [_vi("j", [], TensorProto.INT64), _vi("c_outer", [], TensorProto.BOOL),
                                        _vi("h_outer", [1, 4]), _vi("w_outer", [4, 4])],
                                       [_vi("c_outer_out", [], TensorProto.BOOL), _vi("y", [1, 4]),
                                        _vi("w_outer", [4, 4])])
        arrays["two"] = np.array(2, np.int64)
        inner = helper.make_node("Loop", ["two", "keep_going", "x", "w"], ["y_outer", "w_after"], body=outer_body)
    inits = [numpy_helper.from_array(value, name) for name, value in arrays.items()]
    graph = helper.make_graph([inner], "carried", [_vi("x", [1, 4])], [_vi(inner.output[0], [1, 4])], inits)
    return _model(graph)


def matrix_condition_if_model(*, nested: bool = False, declared: bool = True) -> onnx.ModelProto:
    """PyTorch's ``if score >= 0`` on a [1, 1] score: an If whose condition has rank 2 (ONNX allows any rank for
    its one element; OpenVINO's frontend refuses it), y = 2x when the sum of x is non-negative, else -x.
    ``nested``: that If sits in the then-branch of an outer If on a scalar (always true); ``declared``: the
    condition's shape is in value_info (else only shape inference finds it)."""
    nodes = [helper.make_node("ReduceSum", ["x"], ["score"], keepdims=1),
             helper.make_node("GreaterOrEqual", ["score", "zero"], ["condition"]),
             helper.make_node("If", ["condition"], ["y_inner"], name="verify",
                              then_branch=helper.make_graph([helper.make_node("Mul", ["x", "two"], ["doubled"])],
                                                            "then", [], [_vi("doubled", [1, 4])]),
                              else_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["negated"])], "else", [],
                                                            [_vi("negated", [1, 4])]))]
    inits = [numpy_helper.from_array(np.zeros((1, 1), np.float32), "zero"),
             numpy_helper.from_array(np.float32(2.0), "two")]
    value_info = [_vi("condition", [1, 1], TensorProto.BOOL)] if declared else []
    if nested:
        inner = helper.make_graph(nodes, "inner", [], [_vi("y_inner", [1, 4])], value_info=value_info)
        nodes = [helper.make_node("If", ["always"], ["y_inner"], name="outer", then_branch=inner,
                                  else_branch=helper.make_graph([helper.make_node("Identity", ["x"], ["same"])],
                                                                "same", [], [_vi("same", [1, 4])]))]
        inits.append(numpy_helper.from_array(np.array(True), "always"))
        value_info = []
    graph = helper.make_graph(nodes, "matrix_if", [_vi("x", [1, 4])], [_vi("y_inner", [1, 4])], inits,
                              value_info=value_info)
    return _model(graph)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def scripted_torch_model(path: Path) -> Path:
    """A torch.jit.script'ed module with a data-dependent branch (two LSTMs) and a loop, exported to ONNX."""
    import torch
    from torch import nn

    class Scripted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm16 = nn.LSTM(FEATURES, HIDDEN, batch_first=True)
            self.lstm8 = nn.LSTM(FEATURES, HIDDEN, batch_first=True)
            self.proj = nn.Linear(HIDDEN, 1)

        def forward(self, x: torch.Tensor, sr: torch.Tensor) -> torch.Tensor:
            x = torch.relu(x) * 2.0
            if bool(sr == 16000):
                y, _ = self.lstm16(x)
                y = y + x.mean()
            else:
                y, _ = self.lstm8(x[:, ::2])
            for step in range(x.shape[1] // 8):  # noqa: B007  (TorchScript needs a named loop variable)
                y = y * 0.9 + 0.1
            return torch.sigmoid(self.proj(y[:, -1]))

    torch.manual_seed(0)
    module = torch.jit.script(Scripted())
    torch.onnx.export(module, (torch.randn(1, 32, FEATURES), torch.tensor(16000)), str(path),
                      input_names=["x", "sr"], output_names=["p"], dynamic_axes={"x": {0: "N"}}, opset_version=17,
                      dynamo=False)
    return path
