// The Node SDK's own agent loop (client.beta.messages.toolRunner, default thread behaviour) against a
// radixserve: node tool_runner.cjs <node_modules dir> <base url> <api key> <model>. Prints one JSON
// object: the messages the runner yielded and the request bodies it sent. Used by
// tests/server/test_anthropic_node.py; the package lies outside the repository (make node-sdk).
const { createRequire } = require("node:module");
const path = require("node:path");

const [modulesDir, baseURL, apiKey, model] = process.argv.slice(2);
const requireSdk = createRequire(path.join(modulesDir, "noop.js"));
const Anthropic = requireSdk("@anthropic-ai/sdk").default;
const { betaTool } = requireSdk("@anthropic-ai/sdk/helpers/beta/json-schema");

async function main() {
  const sent = [];
  // Records each body. The first turn is made to call the tool (a 135M model seldom does by itself); later
  // turns go without tool_choice so the model may answer. (In Node, setMessagesParams inside the loop hands
  // the history to the caller and stops the runner answering tools itself, so the field is dropped here.)
  const recordingFetch = async (url, init) => {
    if (init && typeof init.body === "string") {
      const body = JSON.parse(init.body);
      if (sent.length > 0) delete body.tool_choice;
      sent.push(body);
      init = { ...init, body: JSON.stringify(body) };
    }
    return fetch(url, init);
  };
  const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 120000, fetch: recordingFetch });
  const getWeather = betaTool({
    name: "get_weather",
    description: "Current weather in a city.",
    inputSchema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    run: async ({ city }) => `Sunny, 21 C in ${city}.`,
  });
  const runner = client.beta.messages.toolRunner({
    model, max_tokens: 60, max_iterations: 4, temperature: 0, tools: [getWeather],
    tool_choice: { type: "tool", name: "get_weather" },
    system: `You answer weather questions with the get_weather tool. Session ${Date.now()}-${Math.random()}.`,
    messages: [{ role: "user", content: "Call get_weather for Paris, then tell me the weather." }],
  });
  const messages = [];
  for await (const message of runner) messages.push(message);
  console.log(JSON.stringify({ messages, sent }));
}

main().catch((error) => {
  console.error(error && error.stack ? error.stack : String(error));
  process.exit(1);
});
