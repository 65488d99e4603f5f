"""An agent as people write them: the OpenAI client in a loop, unchanged for training.

It answers the task's question, checks itself, and when its history grows past a few messages
compacts it into a summary and goes on from there (a rewritten history: the trainer starts a new
training sample, with the exact tokens of every call kept). Its reward is its last stdout line.

Run by `agilerl train examples/agent/manifest.yaml`, which sets OPENAI_BASE_URL, OPENAI_API_KEY,
AGILERL_TASK (a row of tasks.jsonl) and AGILERL_EPISODE. Against any other endpoint:
    AGILERL_TASK='{"question": "2 + 3", "answer": "5"}' OPENAI_BASE_URL=... python agent.py
"""

import json
import os
import re

from openai import OpenAI

MAX_HISTORY = 4  # messages kept before the agent compacts its history


def main() -> None:
    client = OpenAI()
    task = json.loads(os.environ["AGILERL_TASK"])
    messages = [
        {"role": "system", "content": "Reply with one number."},
        {"role": "user", "content": f"What is {task['question']}?"},
    ]
    answer = ask(client, messages)
    messages += [{"role": "user", "content": "Check it. Reply with the number again."}]
    checked = ask(client, messages)
    if len(messages) > MAX_HISTORY:  # compaction: the agent rewrites its own history
        messages = [
            {"role": "system", "content": "Reply with one number."},
            {"role": "user", "content": f"Question: {task['question']}. Your checked answer: {checked}. Final number?"},
        ]
    final = ask(client, messages)
    print(json.dumps(score(final, str(task["answer"]), answer)))


def ask(client: OpenAI, messages: list) -> str:
    """One call; the reply joins the history as it was given (so the next call extends it)."""
    reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    message = reply.choices[0].message
    messages.append({"role": "assistant", "content": message.content or ""})
    return message.content or ""


def score(final: str, answer: str, first: str) -> dict:
    """1 for the right number; partial credit for replying with a short number at all, so an
    untrained model has a signal to climb."""
    numbers = re.findall(r"-?\d+", final)
    correct = float(bool(numbers) and numbers[-1] == answer)
    numeric = float(bool(re.fullmatch(r"\s*-?\d+\s*", final)))
    consistent = float(final.strip() == first.strip())
    return {"reward": correct + 0.3 * numeric + 0.1 * consistent,
            "components": {"correct": correct, "numeric": numeric, "consistent": consistent}}


if __name__ == "__main__":
    main()
