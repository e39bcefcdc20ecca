import json

import pyarrow.parquet as pq
import pytest

from ragen.create_data import main
from ragen.envs import make_env


def test_writes_train_and_test_start_states(tmp_path, capsys):
    main(["--tags", "SimpleSokoban", "Countdown", "--train-size", "6", "--test-size", "3", "--seed", "100",
          "--output", str(tmp_path)])
    for tag in ("SimpleSokoban", "Countdown"):
        train = pq.read_table(tmp_path / tag / "train.parquet").to_pylist()
        test = pq.read_table(tmp_path / tag / "test.parquet").to_pylist()
        assert [row["seed"] for row in train] == list(range(100, 106))
        assert [row["seed"] for row in test] == [106, 107, 108]
        assert {row["split"] for row in train} == {"train"} and {row["split"] for row in test} == {"test"}
        for row in train + test:
            env = make_env(row["env_type"], json.loads(row["env_config"]))
            assert row["tag"] == tag
            assert row["observation"] == env.reset(seed=row["seed"])[0], "the row reproduces the start state"
            assert row["instructions"] == env.instructions
    assert not list(tmp_path.rglob("*.tmp"))
    assert "SimpleSokoban: 6 train + 3 test rows" in capsys.readouterr().out


def test_unknown_tag_is_rejected(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--tags", "NoSuchEnv", "--output", str(tmp_path)])
    assert "unknown tags ['NoSuchEnv']" in capsys.readouterr().err
