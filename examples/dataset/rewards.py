"""A custom reward function for examples/dataset/run.yaml.

A reward function gets the batch's prompts and completions, and any dataset column it names as a
keyword argument (here ``max_words``, a column of prompts.jsonl); it returns one float per
completion, or None where it does not apply.
"""


def concise(prompts, completions, max_words):
    """1.0 for an answer within the row's word budget, falling to 0 at three times the budget."""
    scores = []
    for text, budget in zip(completions, max_words):
        words = len(text.split())
        scores.append(1.0 if words <= budget else max(0.0, 1.0 - (words - budget) / (2 * budget)))
    return scores
