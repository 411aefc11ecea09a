"""`radixserve generate` / `chat`: one prompt through the plain greedy path."""

from pathlib import Path

from assembly.chat_template import ChatTemplate, TemplateError
from assembly.tokenizer import Tokenizer
from engine.errors import RequestError
from store.errors import ModelFormatError
from engine.generate import greedy_generate, load, stop_token_ids
from model.config import ModelConfig


def generate_text(model_dir: Path, prompt: str, *, max_new_tokens: int, chat: bool, dtype: str = "auto",
                  device: str = "auto", backend: str = "auto") -> str:
    """The model's greedy answer: `prompt` as a user message through the chat
    template when `chat`, else as raw text to continue. Device, dtype, backend and
    stop tokens resolve as the server's engine does."""
    if not prompt:
        raise RequestError("the prompt is empty")
    try:
        tokenizer = Tokenizer(model_dir)
    except FileNotFoundError as error:
        raise ModelFormatError(model_dir, str(error)) from None
    if chat:
        try:
            text = ChatTemplate.from_model_dir(model_dir).render([{"role": "user", "content": prompt}])
        except TemplateError as error:
            raise ModelFormatError(model_dir, str(error)) from None
    else:
        text = prompt
    prompt_ids = tokenizer.encode(text)
    config = ModelConfig.from_model_dir(model_dir)
    if len(prompt_ids) + max_new_tokens > config.max_position_embeddings:
        raise RequestError(
            f"prompt ({len(prompt_ids)} tokens) + max tokens ({max_new_tokens}) exceeds the context "
            f"length {config.max_position_embeddings}"
        )
    try:
        model = load(model_dir, dtype=dtype, device=device, backend=backend)
    except ValueError as error:  # a device or backend that cannot run here
        raise RequestError(str(error)) from None
    stops = stop_token_ids(model_dir, config.eos_token_ids)
    output_ids = greedy_generate(model, prompt_ids, max_new_tokens, stop_token_ids=stops)
    return tokenizer.decode(output_ids, skip_special_tokens=True)
