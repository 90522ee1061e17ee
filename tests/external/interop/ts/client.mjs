// The TypeScript SDK client's cell of the mrtr interop matrix (see tests/external/test_interop.py).
//
// Usage: node client.mjs TARGET SCENARIO [ERA] [-- SERVER COMMAND...]
//   TARGET: an http(s) URL (streamable HTTP), or "stdio" to spawn the server command after "--"
//   SCENARIO: "complete" | "decline"   ERA: "2026-07-28" (default) | "legacy"
// Prints one JSON line: {protocolVersion, isError, text, asked} (or {error}) and exits 0
// (1 on an exception). The answers mirror tests/external/interop/scenario.py: they depend only on the
// question text, so the pytest side can check the final text byte for byte.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const argv = process.argv.slice(2);
const dashes = argv.indexOf('--');
const [target, scenario, era = '2026-07-28'] = dashes < 0 ? argv : argv.slice(0, dashes);
const serverCommand = dashes < 0 ? [] : argv.slice(dashes + 1);
if (!target || !['complete', 'decline'].includes(scenario) || (target === 'stdio' && serverCommand.length === 0)) {
  console.error('usage: node client.mjs URL|stdio complete|decline [2026-07-28|legacy] [-- server command...]');
  process.exit(2);
}

// -- tests/external/interop/scenario.py, mirrored ---------------------------------------------------
const STORE = 'corner shop';
const OWNER = 'Ada';
const ITEMS = ['apples', 'bread', 'coffee'];
const ROOT = { uri: 'file:///interop/home', name: 'home' };
const TITLE = 'Breakfast run';
const DECLINED_ITEM = 2;

function elicitAnswer(message) {
  if (message === `Who is the ${STORE} list for?`) return { action: 'accept', content: { name: OWNER } };
  const item = /^Item (\d+) /.exec(message);
  if (item) {
    const n = Number(item[1]);
    if (scenario === 'decline' && n === DECLINED_ITEM) return { action: 'decline' };
    if (n <= ITEMS.length) return { action: 'accept', content: { item: ITEMS[n - 1], done: false } };
    return { action: 'accept', content: { item: '', done: true } };
  }
  return { action: 'cancel' };
}

function sampleAnswer(prompt) {
  return prompt === `Name a shopping list of: ${ITEMS.join(', ')}` ? TITLE : `unexpected prompt: ${prompt}`;
}

// -- the client ------------------------------------------------------------------------------
const asked = [];
const client = new Client(
  { name: 'mrtr-interop-ts', version: '0.0.0' },
  {
    capabilities: { elicitation: {}, sampling: {}, roots: {} },
    versionNegotiation: { mode: era === 'legacy' ? 'legacy' : { pin: era } },
    inputRequired: { autoFulfill: true, maxRounds: 10 },
  },
);
// In the 2026-07-28 era these handlers answer the embedded inputRequests; in the legacy era,
// real server-to-client requests. Same code either way, as mrtr's server side promises.
client.setRequestHandler('elicitation/create', async (request) => {
  asked.push(request.params.message);
  return elicitAnswer(request.params.message);
});
client.setRequestHandler('sampling/createMessage', async (request) => {
  asked.push('sampling/createMessage');
  const content = request.params.messages[0]?.content;
  const prompt = content && content.type === 'text' ? content.text : JSON.stringify(content);
  return { role: 'assistant', content: { type: 'text', text: sampleAnswer(prompt) }, model: 'interop-model', stopReason: 'endTurn' };
});
client.setRequestHandler('roots/list', async () => {
  asked.push('roots/list');
  return { roots: [ROOT] };
});

let exitCode = 0;
try {
  const transport = target === 'stdio'
    ? new StdioClientTransport({ command: serverCommand[0], args: serverCommand.slice(1), stderr: 'inherit' })
    : new StreamableHTTPClientTransport(new URL(target));
  await client.connect(transport);
  const result = await client.callTool({ name: 'shopping_list', arguments: { store: STORE } });
  const text = (result.content ?? []).filter((block) => block.type === 'text').map((block) => block.text).join('');
  console.log(JSON.stringify({
    protocolVersion: client.getNegotiatedProtocolVersion() ?? null,
    isError: result.isError === true,
    text,
    asked,
  }));
} catch (error) {
  exitCode = 1;
  console.log(JSON.stringify({ error: String(error?.stack ?? error), code: error?.code ?? null, asked }));
} finally {
  await client.close().catch(() => {});
}
process.exit(exitCode);
