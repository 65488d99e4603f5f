"""DatasetEnv: SFT and preference batches checked token by token against the chat template."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from agilerl.data.dataset_env import DatasetEnv
from agilerl.data.tables import load_table
from agilerl.errors import DatasetLoadError, InvalidArgument
from agilerl.manifest.spec import load_manifest

ROWS = [
    {"prompt": f"question {i}?", "response": "answer " * (i % 4 + 1), "chosen": f"yes {i}", "rejected": "no " * (i % 3 + 1)}
    for i in range(12)
]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("dataset_env") / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return load_table(str(path))


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_sft_batch_token_by_token(table, chatml_tokenizer):
    env = DatasetEnv(table, chatml_tokenizer, "sft", train_test_split=0.5, batch_size=6)
    batch = next(env.batches(evaluation=True))
    assert set(batch) == {"input_ids", "attention_mask", "loss_mask", "labels", "prompt_lengths"}
    held_out = env_rows(table, 0.5)[1]
    pad = chatml_tokenizer.pad_token_id
    for i, row in enumerate(held_out):
        prompt_text = f"<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n"
        response_text = f"{row['response']}<|im_end|>\n"
        prompt, response = encode(chatml_tokenizer, prompt_text), encode(chatml_tokenizer, response_text)
        length = len(prompt) + len(response)
        ids = batch["input_ids"][i]
        assert ids[:length].tolist() == prompt + response
        assert (ids[length:] == pad).all()
        assert batch["prompt_lengths"][i] == len(prompt)
        assert batch["loss_mask"][i].tolist() == [False] * len(prompt) + [True] * len(response) + [False] * (
            ids.numel() - length
        )
        assert batch["attention_mask"][i].tolist() == [1] * length + [0] * (ids.numel() - length)
        assert chatml_tokenizer.decode(ids[batch["loss_mask"][i]]) == response_text
        labels = batch["labels"][i]
        assert (labels[~batch["loss_mask"][i]] == -100).all()
        assert labels[batch["loss_mask"][i]].tolist() == response


def test_sft_with_llama3_template_keeps_one_bos(table, llama3_tokenizer):
    env = DatasetEnv(table, llama3_tokenizer, "sft", train_test_split=0.5, batch_size=2)
    batch = next(env.batches(evaluation=True))
    ids = batch["input_ids"][0]
    assert (ids == llama3_tokenizer.bos_token_id).sum() == 1 and ids[0] == llama3_tokenizer.bos_token_id
    start = int(batch["prompt_lengths"][0])
    assert llama3_tokenizer.decode(ids[:start]).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert batch["loss_mask"][0].nonzero()[0].item() == start


def test_preference_batch_shares_the_prompt(table, chatml_tokenizer):
    env = DatasetEnv(
        table,
        chatml_tokenizer,
        "preference",
        prompt_template={"system_0": "Be kind.", "user_1": "{prompt}"},
        train_test_split=0.5,
        batch_size=6,
    )
    batch = next(env.batches(evaluation=True))
    assert set(batch) == {
        "prompt_lengths",
        *(f"{side}_{key}" for side in ("chosen", "rejected") for key in ("input_ids", "attention_mask", "loss_mask")),
    }
    for i, row in enumerate(env_rows(table, 0.5)[1]):
        prompt = encode(
            chatml_tokenizer,
            f"<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n",
        )
        start = int(batch["prompt_lengths"][i])
        assert start == len(prompt)
        for side in ("chosen", "rejected"):
            ids, mask = batch[f"{side}_input_ids"][i], batch[f"{side}_loss_mask"][i]
            response = encode(chatml_tokenizer, f"{row[side]}<|im_end|>\n")
            assert ids[:start].tolist() == prompt
            assert mask.nonzero().flatten().tolist() == list(range(start, start + len(response)))
            assert ids[mask].tolist() == response
            assert batch[f"{side}_attention_mask"][i].sum() == start + len(response)


def env_rows(table, fraction):
    from agilerl.data.tables import split_table

    splits = split_table(table, fraction, 0)
    return list(splits.train), list(splits.test)


def test_overlong_examples_dropped_or_truncated_and_counted(table, chatml_tokenizer):
    lengths = [
        len(encode(chatml_tokenizer, f"<|im_start|>user\n{r['prompt']}<|im_end|>\n<|im_start|>assistant\n{r['response']}<|im_end|>\n"))
        for r in ROWS
    ]
    limit = sorted(lengths)[6]
    too_long = sum(length > limit for length in lengths)
    dropped = DatasetEnv(table, chatml_tokenizer, max_context_length=limit, train_test_split=0.5)
    assert dropped.num_dropped == too_long and dropped.num_truncated == 0
    assert dropped.dataset_size + dropped.eval_dataset_size == len(ROWS) - too_long
    cut = DatasetEnv(table, chatml_tokenizer, max_context_length=limit, overlong="truncate", train_test_split=0.5)
    assert (cut.num_dropped, cut.num_truncated) == (0, too_long)
    for batch in [*cut.batches(), *cut.batches(evaluation=True)]:
        assert batch["attention_mask"].sum(dim=1).max() <= limit
        assert batch["loss_mask"].any(dim=1).all()
    tiny = DatasetEnv(table, chatml_tokenizer, max_context_length=3, overlong="truncate", train_test_split=0.5)
    assert tiny.num_dropped == len(ROWS) and tiny.dataset_size == 0


def test_shuffling_is_per_epoch_and_reproducible(table, chatml_tokenizer):
    def epoch_order(env, epoch):
        return [
            tuple(ids[mask.bool()].tolist())
            for batch in env.batches(epoch)
            for ids, mask in zip(batch["input_ids"], batch["attention_mask"])
        ]

    env = DatasetEnv(table, chatml_tokenizer, train_test_split=0.75, batch_size=4, seed=5)
    twin = DatasetEnv(table, chatml_tokenizer, train_test_split=0.75, batch_size=4, seed=5)
    assert env.num_batches() == 3 and env.num_batches(evaluation=True) == 1
    assert epoch_order(env, 0) == epoch_order(twin, 0)
    assert epoch_order(env, 0) != epoch_order(env, 1)
    assert sorted(epoch_order(env, 0)) == sorted(epoch_order(env, 1))
    other_seed = DatasetEnv(table, chatml_tokenizer, train_test_split=0.75, batch_size=4, seed=6)
    assert epoch_order(other_seed, 0) != epoch_order(env, 0)
    first = [b["input_ids"] for b in env.batches(evaluation=True)]
    again = [b["input_ids"] for b in env.batches(evaluation=True, epoch=3)]
    assert len(first) == len(again) and all(torch.equal(a, b) for a, b in zip(first, again))


def test_from_manifest_with_renames(tmp_path, chatml_tokenizer):
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"q": r["prompt"], "good": r["chosen"], "bad": r["rejected"]}) + "\n" for r in ROWS))
    (tmp_path / "m.yaml").write_text(
        yaml.safe_dump(
            {
                "environment": {
                    "env_type": "dataset",
                    "objective": "preference",
                    "dataset": "pairs.jsonl",
                    "columns": {"q": "prompt", "good": "chosen", "bad": "rejected"},
                    "env_config": {"system_prompt": "Hi."},
                }
            }
        )
    )
    manifest = load_manifest(tmp_path / "m.yaml")
    env = DatasetEnv.from_spec(manifest.environment, chatml_tokenizer, base_dir=manifest.base_dir, batch_size=20)
    assert (env.dataset_size, env.eval_dataset_size) == (11, 1)
    batch = next(env.batches())
    assert chatml_tokenizer.decode(batch["chosen_input_ids"][0]).startswith("<|im_start|>system\nHi.<|im_end|>")


def test_errors(table, chatml_tokenizer):
    with pytest.raises(DatasetLoadError, match=r"objective 'sft' needs column\(s\) 'answer'; the dataset has: prompt, response"):
        DatasetEnv(table, chatml_tokenizer, response_column="answer")
    with pytest.raises(InvalidArgument, match="objective must be"):
        DatasetEnv(table, chatml_tokenizer, "rl")
    with pytest.raises(InvalidArgument, match="overlong must be"):
        DatasetEnv(table, chatml_tokenizer, overlong="wrap")
    numbers = table.map(lambda r: {"n": len(r["prompt"])})
    with pytest.raises(DatasetLoadError, match=r"column 'n' holds int on (train|test) row \d+; it must be text"):
        DatasetEnv(numbers, chatml_tokenizer, response_column="n")
