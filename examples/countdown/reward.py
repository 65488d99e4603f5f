"""The countdown reward: 0.1 for the <think>/<answer> format plus 1.0 for a correct equation.

Returning a dict makes each component show up on its own in the training logs.
"""

from agilerl.llm_envs import countdown, think_answer_format


def reward(completion: str, question: list[int], answer: int) -> dict[str, float]:
    """``question`` holds the numbers and ``answer`` the target (renamed in manifest.yaml)."""
    return {
        "format": 0.1 * think_answer_format(completion),
        "equation": countdown(completion, question, answer),
    }
