"""The user's torch factory and its forward run through ``qdeploy.core.usercode``: an exit there is the user's
code failing, said as such, never qdeploy ending with the user's exit status."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from qdeploy.core.usercode import UserCodeError
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export

NETS = '''
import sys

import torch


def leaves():
    sys.exit(3)


class Exits(torch.nn.Module):
    def forward(self, x):
        sys.exit(4)


def exits_in_forward():
    return Exits()
'''


def _export(tmp_path: Path, factory: str) -> None:
    (tmp_path / "nets.py").write_text(textwrap.dedent(NETS))
    recipe = Recipe(name="t", model={"torch": {"factory": f"{tmp_path / 'nets.py'}:{factory}"},
                                     "inputs": [{"name": "x", "shape": [1, 4]}]}, variants={"v": []})
    ctx = recipe.stage_context("exported", tmp_path / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    export.run(None, recipe.model, ctx)


@pytest.mark.torch
@pytest.mark.parametrize(("factory", "said"), [
    ("leaves", "model.torch.factory {nets}:leaves called sys.exit(3)"),
    ("exits_in_forward", "the forward of model.torch.factory {nets}:exits_in_forward (exporting it) called "
                         "sys.exit(4)"),
])
def test_a_factory_or_forward_that_exits_is_a_user_code_error(tmp_path: Path, factory: str, said: str) -> None:
    pytest.importorskip("torch")
    with pytest.raises(UserCodeError) as raised:
        _export(tmp_path, factory)
    assert said.format(nets=tmp_path / "nets.py") in str(raised.value) and raised.value.exit_code == 2
