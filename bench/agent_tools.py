"""The agent workload's six tools, as OpenAI function definitions, and as system-prompt text."""

import json
from typing import Any


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }}


def _string(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


def _integer(description: str) -> dict[str, str]:
    return {"type": "integer", "description": description}


TOOLS: tuple[dict[str, Any], ...] = (
    _function("search_docs", "Search the Python standard library documentation and return the passages "
              "that best match the query, most relevant first.",
              {"query": _string("what to look for, in plain words"),
               "max_results": _integer("how many passages to return, 1 to 10")}, ["query"]),
    _function("read_file", "Read a text file from the project workspace and return its lines.",
              {"path": _string("path relative to the workspace root"),
               "start_line": _integer("first line to return, 1-based"),
               "num_lines": _integer("how many lines to return")}, ["path"]),
    _function("write_file", "Create or overwrite a text file in the project workspace.",
              {"path": _string("path relative to the workspace root"),
               "content": _string("the complete new content of the file")}, ["path", "content"]),
    _function("run_python", "Run a short Python snippet in a sandbox and return its standard output, "
              "standard error and exit status. No network access; 10 seconds at most.",
              {"code": _string("the Python source to run"),
               "timeout_s": _integer("seconds before the run is stopped")}, ["code"]),
    _function("list_directory", "List the files and folders under a directory of the workspace.",
              {"path": _string("directory relative to the workspace root"),
               "recursive": {"type": "boolean", "description": "also list subdirectories"}}, ["path"]),
    _function("ask_user", "Ask the user a clarifying question and wait for the answer. Use it only when "
              "the task cannot go on without information that no other tool can give.",
              {"question": _string("one short, specific question")}, ["question"]),
)

TOOL_NAMES = tuple(tool["function"]["name"] for tool in TOOLS)


def tools_as_text() -> str:
    """The tool definitions as the text block of the system prompt (the default, peer-neutral mode)."""
    lines = ["You can call these tools. To call one, answer with a single JSON object "
             '{"name": <tool name>, "arguments": {...}} and nothing else. Available tools:']
    lines += [json.dumps(tool["function"], sort_keys=True) for tool in TOOLS]
    return "\n".join(lines)
