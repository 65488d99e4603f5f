"""Loading tables from real files with `datasets`, renaming columns, splitting deterministically."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agilerl.errors import DatasetLoadError
from agilerl.data.tables import load_table, split_table

ROWS = {"nums": [[1, 2], [3, 4], [5, 6], [7, 8]], "target": [3, 7, 11, 15]}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    import datasets

    folder = tmp_path_factory.mktemp("tables")
    pq.write_table(pa.table(ROWS), folder / "rows.parquet")
    with open(folder / "rows.jsonl", "w") as f:
        for nums, target in zip(ROWS["nums"], ROWS["target"]):
            f.write(json.dumps({"nums": nums, "target": target}) + "\n")
    (folder / "rows.csv").write_text("q,a\nwhat is 1+1,2\nwhat is 2+2,4\n")
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(folder / "saved"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(ROWS), "extra": datasets.Dataset.from_dict({"x": [1]})}
    ).save_to_disk(str(folder / "saved_dict"))
    (folder / "hub_like").mkdir()
    pq.write_table(pa.table(ROWS), folder / "hub_like" / "train.parquet")
    (folder / "notes.txt").write_text("not a table")
    return folder


@pytest.mark.parametrize("source", ["rows.parquet", "rows.jsonl", "saved", "saved_dict", "hub_like"])
def test_every_source_kind_loads_the_same_rows(data_dir, source):
    table = load_table(source, base_dir=data_dir)
    assert table.column_names == ["nums", "target"]
    assert list(table["target"]) == ROWS["target"]
    assert table[1]["nums"] == [3, 4]


def test_csv_loads_and_renames(data_dir):
    table = load_table(str(data_dir / "rows.csv"), columns={"q": "question", "a": "answer"})
    assert table.column_names == ["question", "answer"]
    assert table[0] == {"question": "what is 1+1", "answer": 2}


def test_rename_missing_source_column_names_existing_columns(data_dir):
    with pytest.raises(DatasetLoadError, match=r"'numbers' not in dataset .*columns are: nums, target"):
        load_table("rows.parquet", base_dir=data_dir, columns={"numbers": "question"})


def test_rename_onto_an_existing_column_is_refused(data_dir):
    with pytest.raises(DatasetLoadError, match=r"duplicate column\(s\) 'target'"):
        load_table("rows.parquet", base_dir=data_dir, columns={"nums": "target"})


def test_missing_file_says_where_it_looked(data_dir):
    with pytest.raises(DatasetLoadError, match=r"no such file or folder: .*missing\.parquet"):
        load_table("missing.parquet", base_dir=data_dir)


def test_unsupported_file_type(data_dir):
    with pytest.raises(DatasetLoadError, match=r"unsupported file type '\.txt'"):
        load_table("notes.txt", base_dir=data_dir)


def test_saved_dataset_dict_without_the_split(data_dir):
    with pytest.raises(DatasetLoadError, match=r"has no split 'test'; it has: train, extra"):
        load_table("saved_dict", base_dir=data_dir, split="test")


def test_unreachable_hub_id_is_one_clear_error(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetLoadError, match=r"dataset 'no-such-org/no-such-set' could not be loaded"):
        load_table("no-such-org/no-such-set")


def test_split_is_deterministic_disjoint_and_sized():
    import datasets

    table = datasets.Dataset.from_dict({"i": list(range(100))})
    first = split_table(table, 0.8, seed=3)
    again = split_table(table, 0.8, seed=3)
    other = split_table(table, 0.8, seed=4)
    assert (len(first.train), len(first.test)) == (80, 20)
    assert list(first.train["i"]) == list(again.train["i"])
    assert list(first.test["i"]) == list(again.test["i"])
    assert list(first.test["i"]) != list(other.test["i"])
    assert sorted([*first.train["i"], *first.test["i"]]) == list(range(100))


def test_split_keeps_a_row_on_each_side():
    import datasets

    splits = split_table(datasets.Dataset.from_dict({"i": [0, 1]}), 0.99)
    assert (len(splits.train), len(splits.test)) == (1, 1)
    with pytest.raises(DatasetLoadError, match="no rows"):
        split_table(datasets.Dataset.from_dict({"i": []}), 0.5)
