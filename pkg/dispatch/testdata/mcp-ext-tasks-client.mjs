// The official client of the MCP Tasks extension (@modelcontextprotocol/ext-tasks)
// against two /mcp replicas, as a client of protocol 2026-07-28 declaring the
// extension on each request. tools/list and tools/call go to the first replica,
// tasks/get and tasks/cancel to the second. Used by
// TestMCPTasksExtensionOfficialClient:
//   node mcp-ext-tasks-client.mjs <sdk dir> <url a> <url b>
// It prints one JSON line per step.
import path from 'node:path';

const [sdkDir, urlA, urlB] = process.argv.slice(2);
const { withTasks, resultFromTaskOutcome } = await import(
  path.join(sdkDir, 'node_modules/@modelcontextprotocol/ext-tasks/dist/client/index.js'));
const say = (step, v) => console.log(JSON.stringify({ step, ...v }));

let id = 0;
const sent = [];
// A port is how the package reaches a server; this one frames each request
// as 2026-07-28 says (the _meta triple and the Mcp-* headers) and posts it.
const port = {
  endpointId: 'toolrelay-test',
  taskCapabilities: { generation: 'v2', capabilities: {} },
  async dispatch(request, options) {
    const req = { jsonrpc: '2.0', id: ++id, ...structuredClone(request) };
    req.params = req.params ?? {};
    req.params._meta = {
      ...(req.params._meta ?? {}),
      'io.modelcontextprotocol/protocolVersion': '2026-07-28',
      'io.modelcontextprotocol/clientInfo': { name: 'toolrelay-ext-tasks-test', version: '1' },
      'io.modelcontextprotocol/clientCapabilities': { extensions: { 'io.modelcontextprotocol/tasks': {} } },
    };
    const url = req.method.startsWith('tasks/') ? urlB : urlA;
    const headers = {
      'content-type': 'application/json', accept: 'application/json, text/event-stream',
      'mcp-protocol-version': '2026-07-28', 'mcp-method': req.method,
    };
    const name = req.params.name ?? req.params.taskId;
    if (name) headers['mcp-name'] = name;
    const resp = await fetch(url, { method: 'POST', headers, body: JSON.stringify(req), signal: options?.signal });
    let text = await resp.text();
    if ((resp.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
      text = text.split('\n').filter((l) => l.startsWith('data: ') && l.includes('"id"')).at(-1).slice('data: '.length);
    }
    const msg = JSON.parse(text);
    sent.push({ method: req.method, replica: url === urlA ? 'a' : 'b', resultType: msg.result?.resultType ?? null,
      status: msg.result?.status ?? null, error: msg.error?.code ?? null });
    return msg.error ? { kind: 'error', error: msg.error } : { kind: 'result', result: msg.result };
  },
  onServerRequest() { return () => {}; },
  onNotification() { return () => {}; },
  onInvalidated() { return () => {}; },
  invalidated: false,
};

const session = withTasks(port);
try {
  // A task: created on a, settled by polling b.
  const report = await session.callTool('gate', {});
  say('called', { tool: 'gate', kind: report.kind, taskId: report.handle?.taskId ?? null });
  const { outcome } = await report.settle();
  say('result', { text: resultFromTaskOutcome(outcome).content?.[0]?.text ?? null });
  // A task cancelled on b.
  const wait = await session.callTool('wait', { tag: 'ts' });
  say('called', { tool: 'wait', kind: wait.kind, taskId: wait.handle?.taskId ?? null });
  await wait.cancel();
  say('cancelled', {});
} catch (e) {
  say('error', { message: String(e), cause: String(e.cause ?? '') });
  process.exitCode = 1;
} finally {
  say('sent', { sent });
  await session.close();
}
