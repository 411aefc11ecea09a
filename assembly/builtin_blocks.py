"""The built-in Jinja blocks of assembly/templates/, for chat templates that lack tool or document support.

tools_block       tool signatures for the system turn (Hermes style)
documents_block   retrieved documents for the system turn, after the tools
tool_calls        an assistant turn's content and calls, as the model writes them
tool_response     consecutive tool results as one user turn
"""

from importlib import resources
from typing import Any

from assembly.chat_template import TemplateError, compile_template


def _load(name: str):
    source = resources.files("assembly").joinpath("templates", f"{name}.jinja").read_text()
    return compile_template(source, what=f"built-in template {name}")


class BuiltinBlocks:
    def __init__(self):
        self._templates = {name: _load(name)
                           for name in ("tools_block", "documents_block", "tool_calls", "tool_response")}

    def tools(self, tools: list[dict]) -> str:
        return self._render("tools_block", tools=tools)

    def documents(self, documents: list[dict]) -> str:
        return self._render("documents_block", documents=documents)

    def tool_calls(self, content: str, calls: list[dict]) -> str:
        """`calls`: [{"name", "arguments": dict}]."""
        return self._render("tool_calls", content=content, tool_calls=calls)

    def tool_responses(self, responses: list[str]) -> str:
        return self._render("tool_response", responses=responses)

    def _render(self, name: str, **values: Any) -> str:
        try:
            return self._templates[name].render(**values)
        except TemplateError:
            raise
        except Exception as error:  # a value the block cannot render (the request's fault)
            raise TemplateError(f"could not render {name}: {error}") from None
