"""The residual-stream panel's settings, command line and stored translators, without a real model."""
from __future__ import annotations

import pytest
import torch

from analysis.__main__ import main
from analysis.residual import ResidualParams, validate_params
from analysis.residual.errors import ResidualError
from analysis.residual.pairs import factual_pairs, shapes_pairs
from analysis.residual.translators import Translators, load
from analysis.framework.registry import SettingsError


@pytest.mark.parametrize("argv, words", [
    (["residual", "lens", "--lens", "magic"], "Lens must be one of"),
    (["residual", "patch", "--components", "residual,neurons"], "Patched components must be one of"),
    (["residual", "lens", "--top-k", "0"], "Top tokens per cell must be at least 1"),
    (["residual", "lens", "--pair", "own"], "needs both a clean and a corrupted prompt"),
    (["residual", "lens", "--pair", "nonsense"], "Prompt pair must be one of"),
    (["residual", "frobnicate"], "invalid choice"),
])
def test_bad_command_lines_are_one_error_line(argv, words, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


def test_params_round_trip_and_validate():
    p = ResidualParams(pair="capital-france", lens="tuned", components=["heads"], methods=["exact"])
    assert ResidualParams.from_dict(p.to_dict()) == p
    with pytest.raises(SettingsError):
        validate_params(ResidualParams(methods=[]))
    with pytest.raises(ResidualError):
        validate_params(ResidualParams(pair="own", prompt="a b"))


def test_offered_pairs_have_known_answers_and_one_changed_word():
    factual = factual_pairs()
    assert len(factual) >= 16 and len({p.name for p in factual}) == len(factual)
    for p in factual + shapes_pairs():
        a, b = p.clean.split(), p.corrupt.split()
        assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1, p.name
        assert p.answer != p.foil and p.answer and p.foil


def test_shapes_pairs_answer_as_the_world_says():
    from analysis.world import shapes_world as sw

    for p in shapes_pairs():
        words = p.clean.split()
        if p.name.startswith("max"):
            assert p.answer == str(max(int(w) for w in words[3:-1]))
            assert p.foil == str(max(int(w) for w in p.corrupt.split()[3:-1]))
        if p.name.startswith("needle"):
            asked = words[-2]
            assert words[words.index(asked) + 1] == p.answer and p.foil in sw.key_values(asked)


def test_translators_apply_save_and_load(tmp_path):
    torch.manual_seed(0)
    d = 8
    full = Translators(2, {0: (torch.randn(d, d),), 1: (torch.randn(d, 3), torch.randn(d, 3))},
                       {0: torch.randn(d), 1: torch.randn(d)}, {"probe": [1.0]})
    h = torch.randn(5, d)
    w0 = full.weights[0][0]
    assert torch.allclose(full.apply(0, h), h + h @ w0.T + full.biases[0])
    u, v = full.weights[1]
    assert torch.allclose(full.apply(1, h), h + h @ (u @ v.T).T + full.biases[1], atol=1e-5)
    assert torch.equal(full.apply(2, h), h)  # the last state is read as it is
    again = load(full.save(tmp_path / "lens", dtype=torch.float32))
    assert again.layers == 2 and torch.allclose(again.apply(1, h), full.apply(1, h))
