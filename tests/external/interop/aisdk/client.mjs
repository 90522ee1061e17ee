// A Node client built on the Vercel AI SDK's MCP client (`@ai-sdk/mcp`) runs `keep_word`:
// `node client.mjs URL`. It answers the form with onElicitationRequest (keep: true) and prints
// one JSON report: the protocol version it negotiated, the tool's text, every question it saw.
// @ai-sdk/mcp offers no sampling or roots handlers, so the flow asks a form only.
import { createMCPClient, ElicitationRequestSchema } from '@ai-sdk/mcp';

const [url] = process.argv.slice(2);
const asked = [];
let versionSeen = null;
try {
  const client = await createMCPClient({
    transport: { type: 'http', url },
    clientName: 'mrtr-interop-aisdk',
    capabilities: { elicitation: {} },
  });
  client.onElicitationRequest(ElicitationRequestSchema, async (request) => {
    asked.push(request.params.message);
    return { action: 'accept', content: { keep: true } };
  });
  versionSeen = client.transport?.protocolVersion ?? null; // set from the initialize result
  const tools = await client.tools();
  const result = await tools.keep_word.execute({ word: 'ping' }, { toolCallId: 'call-1', messages: [] });
  const text = (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');
  await client.close();
  console.log(JSON.stringify({ protocolVersion: versionSeen, isError: Boolean(result.isError), text, asked }));
} catch (error) {
  console.log(JSON.stringify({ error: `${error?.name}: ${error?.message}` }));
  process.exit(1);
}
