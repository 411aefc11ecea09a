"""The exact pass's answers kept on disk, so runs over the same prompts pay the exact pass once.

Keyed by each prompt's token ids: an entry is used only for the very same prompt, and a prompt
list that extends an earlier one (the generator is prefix-stable: the first 40 of 200 prompts are
the 40 prompts of a smaller run) reuses what it shares. The file records the git commit it was
computed at; the harness's `--self-test` variant checks the current engine still agrees with it.
"""

import hashlib
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class ExactAnswer:
    answer_ids: list[int]
    answer_text: str
    rows: torch.Tensor  # (len(answer_ids) + 1, vocab) float32, from prompt_tail_logits
    num_computed_prompt_tokens: int  # with reuse off, the prefix cache on, the prompts run in order


def prompt_key(token_ids: Sequence[int], salt: str = "") -> str:
    """`salt` keeps passes of another setup (e.g. another backend) apart in one file; "" as before."""
    return hashlib.sha256((salt + ",".join(map(str, token_ids))).encode()).hexdigest()


def current_commit() -> str:
    try:
        result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() or "unknown"


def load_exact_answers(path: Path, prompts_token_ids: Sequence[Sequence[int]], salt: str = "",
                       ) -> tuple[list[ExactAnswer], str, float]:
    """The cached answers of the longest leading run of these prompts the file holds, the commit
    they were computed at, and the seconds the exact pass that wrote the file took."""
    if not path.is_file():
        return [], "", 0.0
    saved = torch.load(path, weights_only=False)
    answers = []
    for token_ids in prompts_token_ids:
        entry = saved["answers"].get(prompt_key(token_ids, salt))
        if entry is None:
            break
        answers.append(ExactAnswer(**entry))
    return answers, saved.get("commit", "unknown"), float(saved.get("seconds", 0.0))


def save_exact_answers(path: Path, prompts_token_ids: Sequence[Sequence[int]], answers: Sequence[ExactAnswer],
                       commit: str, seconds: float, salt: str = "") -> None:
    """Merged into what the file holds; written to a temporary file first, then renamed."""
    saved = torch.load(path, weights_only=False) if path.is_file() else {"answers": {}}
    for token_ids, answer in zip(prompts_token_ids, answers):
        saved["answers"][prompt_key(token_ids, salt)] = dict(answer_ids=answer.answer_ids, answer_text=answer.answer_text,
                                                       rows=answer.rows,
                                                       num_computed_prompt_tokens=answer.num_computed_prompt_tokens)
    saved["commit"], saved["seconds"] = commit, seconds
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    torch.save(saved, temporary)
    temporary.replace(path)
