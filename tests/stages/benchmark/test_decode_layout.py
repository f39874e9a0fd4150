"""Telling a decoder with a KV cache from its interface alone: past inputs paired with present outputs by their
shared name suffix (several exporters' spellings), the past-length axis from the symbolic dims, and a clear refusal
(``NotDecodable``) where the pairing is ambiguous."""

from __future__ import annotations

import numpy as np
import pytest

from qdeploy.stages.benchmark._cache_layout import Declared, NotDecodable, find_layout, pair_names

F32, F16, I64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)
PAST = ("batch", 4, "past_sequence_length", 8)
TOTAL = ("batch", 4, "total_sequence_length", 8)


def _interface(past: str, present: str, *, layers: int = 2, kinds: tuple[str, ...] = (".key", ".value"),
               past_shape: tuple = PAST, present_shape: tuple = TOTAL, dtype: np.dtype = F32,
               extra: tuple[Declared, ...] = ()) -> tuple[list[Declared], list[Declared]]:
    inputs = [Declared("input_ids", I64, ("batch", "sequence_length")),
              Declared("attention_mask", I64, ("batch", "total_sequence_length")),
              Declared("position_ids", I64, ("batch", "sequence_length")), *extra]
    outputs = [Declared("logits", F32, ("batch", "sequence_length", 1000))]
    for index in range(layers):
        for kind in kinds:
            inputs.append(Declared(past.format(i=index) + kind, dtype, past_shape))
            outputs.append(Declared(present.format(i=index) + kind, dtype, present_shape))
    return inputs, outputs


@pytest.mark.parametrize(("past", "present"), [
    ("past_key_values.{i}", "present.{i}"),                 # optimum
    ("past_key_values.{i}", "present_key_values.{i}"),
    ("past_key_values_{i}", "present_{i}"),
    ("past.{i}", "present.{i}"),
])
def test_pasts_pair_with_presents_by_their_shared_suffix(past: str, present: str) -> None:
    layout = find_layout(*_interface(past, present, layers=3))
    assert layout is not None
    pairs = {pair.past: pair.present for pair in layout.pairs}
    assert pairs == {past.format(i=i) + kind: present.format(i=i) + kind for i in range(3) for kind in (".key",
                                                                                                        ".value")}
    assert {pair.axis for pair in layout.pairs} == {2} and {pair.batch_axis for pair in layout.pairs} == {0}
    assert (layout.input_ids, layout.attention_mask, layout.logits, layout.vocab) == (
        "input_ids", "attention_mask", "logits", 1000)
    assert [name for name, _, _ in layout.positions] == ["position_ids"]


def test_stacked_key_value_per_layer_gpt2_style() -> None:
    """``past.{i}`` [2, batch, heads, past, head_dim]: key and value stacked, the past length on axis 3."""
    layout = find_layout(*_interface("past.{i}", "present.{i}", kinds=("",),
                                     past_shape=(2, "batch", 4, "past_seq", 8),
                                     present_shape=(2, "batch", 4, "past_seq + 1", 8)))
    assert layout is not None and [(p.past, p.present, p.axis, p.batch_axis) for p in layout.pairs] == [
        ("past.0", "present.0", 3, 1), ("past.1", "present.1", 3, 1)]
    assert layout.pairs[0].empty(3).shape == (2, 3, 4, 0, 8)


def test_the_axis_that_grows_when_past_and_present_share_one_symbol() -> None:
    layout = find_layout(*_interface("past_key_values.{i}", "present.{i}", past_shape=("batch", 4, "seq", 8),
                                     present_shape=("batch", 4, "seq", 8)))
    assert layout is not None and layout.pairs[0].axis == 2


def test_past_element_type_is_the_declared_one_and_empty_caches_have_no_length() -> None:
    layout = find_layout(*_interface("past_key_values.{i}", "present.{i}", dtype=F16))
    assert layout is not None
    empty = layout.pairs[0].empty(2)
    assert empty.dtype == np.float16 and empty.shape == (2, 4, 0, 8)
    feeds = layout.step_inputs(np.array([[5], [6]]), past=7)
    assert feeds["attention_mask"].shape == (2, 8) and feeds["position_ids"].tolist() == [[7], [7]]


def test_a_model_without_a_cache_is_not_a_decoder() -> None:
    inputs = [Declared("input_ids", I64, ("batch", "sequence_length"))]
    assert find_layout(inputs, [Declared("last_hidden_state", F32, ("batch", "sequence_length", 64))]) is None


@pytest.mark.parametrize(("case", "interface", "why"), [
    ("two pasts on one present", lambda: ([*_interface("past_key_values.{i}", "present.{i}", layers=1)[0],
                                           Declared("past.0.key", F32, PAST)],
                                          _interface("past_key_values.{i}", "present.{i}", layers=1)[1]),
     "several past inputs"),
    ("a tie", lambda: ([Declared("input_ids", I64, ("batch", "s")), Declared("past_a.0", F32, PAST)],
                       [Declared("logits", F32, ("batch", "s", 10)), Declared("present_x.0", F32, TOTAL),
                        Declared("present_y.0", F32, TOTAL)]), "pairs equally well"),
    ("an unknown input", lambda: _interface("past_key_values.{i}", "present.{i}",
                                            extra=(Declared("use_cache_branch", np.dtype(bool), (1,)),)),
     "use_cache_branch"),
    ("no past axis", lambda: _interface("past_key_values.{i}", "present.{i}", past_shape=("batch", "h", "p", 8),
                                        present_shape=("batch", "h", "p", 8)), "past-length axis"),
    ("presents only", lambda: ([Declared("input_ids", I64, ("batch", "s"))],
                               [Declared("logits", F32, ("batch", "s", 10)), Declared("present.0.key", F32, TOTAL)]),
     "without their counterparts"),
])
def test_an_ambiguous_interface_is_refused_with_its_reason(case: str, interface, why: str) -> None:
    with pytest.raises(NotDecodable, match=why):
        find_layout(*interface())


def test_pairing_needs_a_partner_for_every_present() -> None:
    with pytest.raises(NotDecodable, match="feed no past input"):
        pair_names(["past.0.key"], ["present.0.key", "present.0.value"])
