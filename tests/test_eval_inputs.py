"""`memrl eval` error paths are one line (issue 47): a model of an architecture transformers
does not know."""

from __future__ import annotations

import json
import shutil

from memrl.cli import main


def test_an_unknown_model_type_is_one_line_and_exit_2(tiny_model_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "foobar"}))
    data = tmp_path / "data"
    data.mkdir()
    (data / "eval_2.json").write_text("[]")
    code = main(["eval", f"model.path={model}", f"eval.benchmarks=[ruler-hqa={data}]",
                 "eval.num_docs=[2]", f"eval.out_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "unknown architecture: model_type 'foobar'" in err, err
