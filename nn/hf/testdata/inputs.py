"""The inputs of the goldens of gen.py and gen_transformers.py (standard
library only, so both virtualenvs can import it)."""

# Right-padded batches (every query sees at least its first key).
BERT_INPUTS = {
    "ids": [[2, 17, 5, 33, 8, 21, 3], [2, 9, 30, 3, 0, 0, 0]],
    "types": [[0, 0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]],
    "mask": [[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]],
}
LM_INPUTS = {
    "ids": [[5, 11, 2, 40, 7, 19], [31, 4, 26, 0, 0, 0]],
    "mask": [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]],
}

# Greedy continuations: each prompt batch (rows of one length) and the number
# of new tokens.
GREEDY = {
    "gpt2": ([[5, 11, 2, 40], [31, 4, 26, 9]], 12),  # 4 + 12 ≤ n_positions 16
    "llama": ([[5, 11, 2, 40, 7], [31, 4, 26, 9, 60]], 24),
}

# Greedy continuations of prompts of different lengths in one batch: each
# model's prompts (left-padded with an attention mask for transformers'
# generate) and the number of new tokens.
GREEDY_PADDED = {
    "gpt2": ([[5, 11, 2], [31, 4, 26, 9, 40, 7, 19], [40, 7, 19, 2, 8]], 9),  # 7 + 9 ≤ n_positions 16
    "llama": ([[5, 11, 2], [31, 4, 26, 9, 60, 7, 19], [40, 7, 19, 2, 8]], 16),
}
