"""The anthropic Node SDK's own agent loop (`client.beta.messages.toolRunner`, default thread behaviour) runs
to a final message on the real server, each later turn a thread `continue` with only the tool results.
Needs node and @anthropic-ai/sdk, which `make node-sdk` installs outside the repository
($RADIXSERVE_HOME/peers/node-anthropic, or $RADIXSERVE_NODE_SDK_DIR); skipped, saying which is missing, without."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.server.conftest import API_KEY, PAGE_SIZE

pytestmark = [pytest.mark.model, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "node" / "tool_runner.cjs"


def _modules_dir() -> Path:
    if "RADIXSERVE_NODE_SDK_DIR" in os.environ:
        return Path(os.environ["RADIXSERVE_NODE_SDK_DIR"]) / "node_modules"
    home = Path(os.environ.get("RADIXSERVE_HOME", Path.home() / ".cache" / "radixserve"))
    return home / "peers" / "node-anthropic" / "node_modules"


@pytest.fixture(scope="module")
def modules_dir() -> Path:
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    modules = _modules_dir()
    if not (modules / "@anthropic-ai" / "sdk" / "package.json").exists():
        pytest.skip(f"@anthropic-ai/sdk is not installed under {modules}: run `make node-sdk`")
    return modules


def test_the_node_sdk_tool_runner_runs_to_a_final_message_on_a_thread(modules_dir, server):
    run = subprocess.run(["node", str(SCRIPT), str(modules_dir), server.base_url, API_KEY, server.model],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    messages, sent = result["messages"], result["sent"]
    assert messages[0]["stop_reason"] == "tool_use" and len(messages) >= 2
    [use] = [block for block in messages[0]["content"] if block["type"] == "tool_use"]
    assert use["id"].startswith("toolu_") and use["input"] == {"city": "Paris"}
    assert len(messages) == 4 or messages[-1]["stop_reason"] != "tool_use"  # it stopped by itself, or at the cap
    assert sent[0]["thread"] == {"type": "create"}
    for body, previous in zip(sent[1:], messages):
        assert body["thread"] == {"type": "continue", "previous_message_id": previous["id"]}
        assert "system" not in body and "tools" not in body
        assert [block["type"] for block in body["messages"][0]["content"]] == ["tool_result"]
    for previous, message in zip(messages, messages[1:]):
        previous_total = sum(previous["usage"][k] for k in ("input_tokens", "cache_read_input_tokens",
                                                          "cache_creation_input_tokens", "output_tokens"))
        assert message["usage"]["cache_read_input_tokens"] >= previous_total // PAGE_SIZE * PAGE_SIZE > 0
